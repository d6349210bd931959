-- XEP-0484 FAST tokens: two slots per client of an account ('current' = 0,
-- 'new' = 1, as the XEP's implementation notes suggest). The token itself
-- is never stored: it is derived from `nonce` with the server's FAST key
-- (data_dir/fast.key), so these rows alone authenticate nobody. Deleting
-- the account deletes them; a password change deletes them too
-- (set_credentials).
CREATE TABLE fast_tokens (
    domain     TEXT    NOT NULL,
    username   TEXT    NOT NULL,
    agent      TEXT    NOT NULL,
    slot       INTEGER NOT NULL,
    nonce      TEXT    NOT NULL,
    mechanism  TEXT    NOT NULL,
    expires_at INTEGER NOT NULL, -- milliseconds since the Unix epoch
    PRIMARY KEY (domain, username, agent, slot),
    FOREIGN KEY (domain, username) REFERENCES accounts (domain, username) ON DELETE CASCADE
) WITHOUT ROWID;
