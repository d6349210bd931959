-- Last logout time and status text of each account (XEP-0012), the
-- last-activity module's own table (modules/last/store/). Databases made
-- before step 17 have it from step 2 (im-core), which created it then.
CREATE TABLE IF NOT EXISTS last_activity (
    domain   TEXT    NOT NULL,
    username TEXT    NOT NULL,
    at       INTEGER NOT NULL,
    status   TEXT    NOT NULL,
    PRIMARY KEY (domain, username)
) WITHOUT ROWID;
