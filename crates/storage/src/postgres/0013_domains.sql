-- Domains added at run time (docs/domains.md). Domains of the
-- configuration file are not stored here. `state` is 'enabled',
-- 'disabled' or 'removing' (data being deleted; the row goes last);
-- `settings` is the server's JSON of the domain's overrides (with its
-- own format version). `version` is the value of the one change counter
-- (`domains_version`, a single row) at the row's last change: every node
-- polls that row (one primary-key read every 2 s) and reads the table
-- only when it moved. Writers update the counter row first, so they
-- take turns on it.
CREATE TABLE domains (
    name       TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    state      TEXT   NOT NULL,
    settings   TEXT   NOT NULL,
    created_at BIGINT NOT NULL, -- milliseconds since the Unix epoch
    version    BIGINT NOT NULL
);

CREATE TABLE domains_version (
    id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    version BIGINT  NOT NULL
);
INSERT INTO domains_version (id, version) VALUES (1, 0);
