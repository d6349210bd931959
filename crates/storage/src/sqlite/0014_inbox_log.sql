-- Inbox updates are appended here, committed, and merged into `inbox` in
-- key order in large runs (`sqlite/inbox_log.rs`): written in place, every
-- archived message dirtied two inbox pages at random places in a table of
-- millions of conversations, and the cost per message grew with the
-- number of conversations. `unread_op`: 0 keep, 1 add, 2 set. No index:
-- rows are read only in order (recovery), and a removal scans at most one
-- merge's worth of them.
CREATE TABLE inbox_log (
    seq        INTEGER PRIMARY KEY,
    domain     TEXT    NOT NULL,
    username   TEXT    NOT NULL,
    remote     TEXT    NOT NULL,
    last_id    INTEGER,
    unread_op  INTEGER NOT NULL,
    unread     INTEGER NOT NULL,
    shared     BOOLEAN NOT NULL
);
-- How far the merge under way got (`sqlite/inbox_log.rs`): log rows up to
-- `seq_upto` of conversations up to (`key_domain`, `key_username`,
-- `key_remote`) are in `inbox`; `gen` counts merge transactions, so that a
-- reader can tell whether one committed while it read.
CREATE TABLE inbox_merge (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    gen           INTEGER NOT NULL,
    seq_upto      INTEGER NOT NULL,
    key_domain    TEXT,
    key_username  TEXT,
    key_remote    TEXT
);
INSERT INTO inbox_merge (id, gen, seq_upto) VALUES (1, 0, 0);
