-- Instant-messaging core: rosters (RFC 6121) with per-owner versions and
-- tombstones for XEP-0237, pending subscription requests, per-user XML
-- documents (XEP-0054, XEP-0049). (Block lists and last activity were
-- created here until they became their modules' steps 18 and 17.)
CREATE TABLE roster_versions (
    domain   TEXT    NOT NULL,
    username TEXT    NOT NULL,
    version  INTEGER NOT NULL,
    PRIMARY KEY (domain, username)
) WITHOUT ROWID;

CREATE TABLE roster_items (
    domain       TEXT    NOT NULL,
    username     TEXT    NOT NULL,
    contact      TEXT    NOT NULL,
    name         TEXT,
    subscription TEXT    NOT NULL,
    ask          INTEGER NOT NULL,
    pending_in   INTEGER NOT NULL,
    approved     INTEGER NOT NULL,
    -- group names joined with U+001F, a character XML text cannot contain
    groups       TEXT    NOT NULL,
    version      INTEGER NOT NULL,
    removed      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (domain, username, contact)
) WITHOUT ROWID;
CREATE INDEX roster_items_by_version ON roster_items (domain, username, version);

CREATE TABLE subscription_requests (
    domain     TEXT    NOT NULL,
    username   TEXT    NOT NULL,
    contact    TEXT    NOT NULL,
    stanza     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (domain, username, contact)
) WITHOUT ROWID;

CREATE TABLE user_data (
    domain   TEXT NOT NULL,
    username TEXT NOT NULL,
    kind     TEXT NOT NULL,
    key      TEXT NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (domain, username, kind, key)
) WITHOUT ROWID;
