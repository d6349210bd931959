-- Last logout time and status text of each account (XEP-0012), the
-- last-activity module's own table (modules/last/store/). Databases made
-- before step 17 have it from step 2 (im-core), which created it then.
CREATE TABLE IF NOT EXISTS last_activity (
    domain   TEXT COLLATE "C" NOT NULL,
    username TEXT COLLATE "C" NOT NULL,
    at       BIGINT NOT NULL, -- seconds since the Unix epoch
    status   TEXT   NOT NULL,
    PRIMARY KEY (domain, username)
);
