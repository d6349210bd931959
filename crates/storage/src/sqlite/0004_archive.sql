-- Message archive (XEP-0313). `id` is the time-ordered archive id
-- (microseconds << 8 | node), unique across the deployment, so it is the
-- rowid: pages are range scans on (domain, username, id) and a time range
-- is an id range. No timestamp column or index is needed.
CREATE TABLE archive (
    id         INTEGER PRIMARY KEY,
    domain     TEXT    NOT NULL,
    username   TEXT    NOT NULL,
    with_bare  TEXT    NOT NULL,
    remote     TEXT    NOT NULL,
    outgoing   INTEGER NOT NULL,
    origin_id  TEXT,
    flags      INTEGER NOT NULL,
    stanza     TEXT    NOT NULL
);
-- Two indexes only: every archived row touches each index page it lands
-- on, and with many owners those pages are scattered, so each index costs
-- write bandwidth. Retraction and marker lookups by origin id scan one
-- conversation newest-first in archive_by_with, which carries origin_id so
-- the scan never visits the table (they are almost always about recent
-- messages).
CREATE INDEX archive_by_owner ON archive (domain, username, id);
CREATE INDEX archive_by_with ON archive (domain, username, with_bare, id, origin_id);

-- Archiving preferences (XEP-0441); `always`/`never` are newline-separated JIDs.
CREATE TABLE archive_prefs (
    domain     TEXT NOT NULL,
    username   TEXT NOT NULL,
    def        TEXT NOT NULL,
    always     TEXT NOT NULL,
    never      TEXT NOT NULL,
    PRIMARY KEY (domain, username)
);

-- Inbox (XEP-0430): one small row per conversation, clustered by owner
-- (updated at every message); the last message is joined from the archive.
CREATE TABLE inbox (
    domain      TEXT    NOT NULL,
    username    TEXT    NOT NULL,
    remote      TEXT    NOT NULL,
    last_id     INTEGER NOT NULL,
    unread      INTEGER NOT NULL,
    PRIMARY KEY (domain, username, remote)
) WITHOUT ROWID;
CREATE INDEX inbox_by_last ON inbox (domain, username, last_id);
