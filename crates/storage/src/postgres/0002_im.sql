-- Instant-messaging core: rosters (RFC 6121) with per-owner versions and
-- tombstones for XEP-0237, pending subscription requests, per-user XML
-- documents (XEP-0054, XEP-0049). (Block lists and last activity were
-- created here until they became their modules' steps 18 and 17.)
-- Every table is keyed by the owner (domain, username) first.
CREATE TABLE roster_versions (
    domain   TEXT COLLATE "C" NOT NULL,
    username TEXT COLLATE "C" NOT NULL,
    version  BIGINT NOT NULL,
    PRIMARY KEY (domain, username)
);

CREATE TABLE roster_items (
    domain       TEXT COLLATE "C" NOT NULL,
    username     TEXT COLLATE "C" NOT NULL,
    contact      TEXT COLLATE "C" NOT NULL,
    name         TEXT,
    subscription TEXT    NOT NULL CHECK (subscription IN ('none', 'to', 'from', 'both')),
    ask          BOOLEAN NOT NULL,
    pending_in   BOOLEAN NOT NULL,
    approved     BOOLEAN NOT NULL,
    groups       TEXT[]  NOT NULL, -- unique, in the client's order
    version      BIGINT  NOT NULL,
    removed      BOOLEAN NOT NULL DEFAULT FALSE, -- tombstone
    PRIMARY KEY (domain, username, contact)
);
CREATE INDEX roster_items_by_version ON roster_items (domain, username, version);

CREATE TABLE subscription_requests (
    domain     TEXT COLLATE "C" NOT NULL,
    username   TEXT COLLATE "C" NOT NULL,
    contact    TEXT COLLATE "C" NOT NULL,
    stanza     TEXT   NOT NULL,
    created_at BIGINT NOT NULL, -- seconds since the Unix epoch
    PRIMARY KEY (domain, username, contact)
);

CREATE TABLE user_data (
    domain   TEXT COLLATE "C" NOT NULL,
    username TEXT COLLATE "C" NOT NULL,
    kind     TEXT COLLATE "C" NOT NULL,
    key      TEXT COLLATE "C" NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (domain, username, kind, key)
);
