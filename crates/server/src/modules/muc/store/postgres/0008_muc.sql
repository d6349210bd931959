-- Group-chat rooms (XEP-0045): what outlives a room's occupants. A room
-- JID `name@service` is keyed by its domain (the MUC service) and its node
-- (the room name). `config` and `subject` are the MUC module's own
-- serialization, stored verbatim. A room's messages live in the archive,
-- with the room's JID as owner.
CREATE TABLE muc_rooms (
    service    TEXT COLLATE "C" NOT NULL,
    name       TEXT COLLATE "C" NOT NULL,
    config     TEXT   NOT NULL,
    subject    TEXT   NOT NULL, -- empty when no subject is set
    created_at BIGINT NOT NULL, -- milliseconds since the Unix epoch; kept by updates
    PRIMARY KEY (service, name)
);

-- Affiliations (owner, admin, member, outcast; `none` is no row) of bare
-- JIDs or domains with a room, with the nickname registered with it and
-- the reason given. Deleting the room deletes them (in the same
-- transaction, no foreign key: rows may be written before the room is).
-- Looked up by JID for a user's rooms and for account deletion.
CREATE TABLE muc_affiliations (
    service     TEXT COLLATE "C" NOT NULL,
    name        TEXT COLLATE "C" NOT NULL,
    jid         TEXT COLLATE "C" NOT NULL,
    affiliation TEXT NOT NULL,
    nick        TEXT NULL,
    reason      TEXT NULL,
    PRIMARY KEY (service, name, jid)
);
CREATE INDEX muc_affiliations_by_jid ON muc_affiliations (jid);
