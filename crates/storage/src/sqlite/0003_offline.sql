-- Offline messages (XEP-0160). AUTOINCREMENT: ids are never reused, so
-- they order an owner's queue even across deletions.
CREATE TABLE offline_messages (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    domain     TEXT    NOT NULL,
    username   TEXT    NOT NULL,
    sender     TEXT    NOT NULL,
    stanza     TEXT    NOT NULL,
    stamp      INTEGER NOT NULL
);
CREATE INDEX offline_messages_by_owner ON offline_messages (domain, username, id);
