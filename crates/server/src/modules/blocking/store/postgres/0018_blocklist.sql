-- Each account's block list (XEP-0191), the blocking module's own table
-- (modules/blocking/store/). Databases made before step 18 have it from
-- step 2 (im-core), which created it then.
CREATE TABLE IF NOT EXISTS blocklist (
    domain   TEXT COLLATE "C" NOT NULL,
    username TEXT COLLATE "C" NOT NULL,
    jid      TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (domain, username, jid)
);
