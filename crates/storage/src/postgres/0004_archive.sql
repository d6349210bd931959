-- Message archive (XEP-0313). `id` is the time-ordered archive id
-- (microseconds << 8 | node), unique across the deployment, so it is the
-- primary key; pages are range scans on (domain, username, id) and a time
-- range is an id range (no timestamp column or index). Retraction and
-- marker lookups by origin id scan one conversation newest-first in
-- archive_by_with, which INCLUDEs origin_id (index-only until the match).
CREATE TABLE archive (
    id         BIGINT  PRIMARY KEY,
    domain     TEXT COLLATE "C" NOT NULL,
    username   TEXT COLLATE "C" NOT NULL,
    with_bare  TEXT COLLATE "C" NOT NULL,
    remote     TEXT    NOT NULL,
    outgoing   BOOLEAN NOT NULL,
    origin_id  TEXT,
    flags      INTEGER NOT NULL,
    stanza     TEXT    NOT NULL
);
CREATE INDEX archive_by_owner ON archive (domain, username, id);
CREATE INDEX archive_by_with ON archive (domain, username, with_bare, id) INCLUDE (origin_id);

-- Archiving preferences (XEP-0441).
CREATE TABLE archive_prefs (
    domain     TEXT COLLATE "C" NOT NULL,
    username   TEXT COLLATE "C" NOT NULL,
    def        TEXT   NOT NULL,
    always     TEXT[] NOT NULL,
    never      TEXT[] NOT NULL,
    PRIMARY KEY (domain, username)
);

-- Inbox (XEP-0430): one small row per conversation (updated at every
-- message); the last message is joined from the archive.
CREATE TABLE inbox (
    domain      TEXT COLLATE "C" NOT NULL,
    username    TEXT COLLATE "C" NOT NULL,
    remote      TEXT COLLATE "C" NOT NULL,
    last_id     BIGINT  NOT NULL,
    unread      INTEGER NOT NULL,
    PRIMARY KEY (domain, username, remote)
);
CREATE INDEX inbox_by_last ON inbox (domain, username, last_id);
