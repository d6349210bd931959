-- Offline messages (XEP-0160). Ids come from an identity sequence and are
-- never reused; stores for one owner are serialized by an advisory lock
-- (see offline.rs), so one owner's ids grow in storage order.
CREATE TABLE offline_messages (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    domain   TEXT COLLATE "C" NOT NULL,
    username TEXT COLLATE "C" NOT NULL,
    sender   TEXT   NOT NULL,
    stanza   TEXT   NOT NULL,
    stamp    BIGINT NOT NULL -- milliseconds since the Unix epoch
);
CREATE INDEX offline_messages_by_owner ON offline_messages (domain, username, id);
