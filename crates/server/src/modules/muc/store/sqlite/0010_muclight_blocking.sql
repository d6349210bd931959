-- MUC Light blocking lists (MongooseIM's MUC Light protocol, "Blocking
-- functionality"): the rooms (`kind` 'room', the room's bare JID) and the
-- users (`kind` 'user', their bare JID) that `owner` (a bare JID) refuses
-- to be added to rooms by. Listed by owner (kind, then jid); looked up by
-- (owner, kind, jid) for a room's new members; deleted by owner with the
-- account. Rows naming a room or user outlive them: they are the owner's.
CREATE TABLE muclight_blocking (
    owner TEXT NOT NULL,
    kind  TEXT NOT NULL CHECK (kind IN ('room', 'user')),
    jid   TEXT NOT NULL,
    PRIMARY KEY (owner, kind, jid)
) WITHOUT ROWID;
