-- Domains added at run time (docs/domains.md). Domains of the
-- configuration file are not stored here. `state` is 'enabled',
-- 'disabled' or 'removing' (data being deleted; the row goes last);
-- `settings` is the server's JSON of the domain's overrides (with its
-- own format version). `version` is the value of the one change counter
-- (`domains_version`, a single row) at the row's last change: every node
-- polls that row (one primary-key read every 2 s) and reads the table
-- only when it moved.
CREATE TABLE domains (
    name       TEXT    NOT NULL PRIMARY KEY,
    state      TEXT    NOT NULL,
    settings   TEXT    NOT NULL,
    created_at INTEGER NOT NULL, -- milliseconds since the Unix epoch
    version    INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE domains_version (
    id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO domains_version (id, version) VALUES (1, 0);
