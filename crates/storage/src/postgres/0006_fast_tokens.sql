-- XEP-0484 FAST tokens: two slots per client of an account ('current' = 0,
-- 'new' = 1, as the XEP's implementation notes suggest). The token itself
-- is never stored: it is derived from `nonce` with the server's FAST key,
-- so these rows alone authenticate nobody. Deleting the account deletes
-- them; a password change deletes them too (set_credentials).
CREATE TABLE fast_tokens (
    domain     TEXT COLLATE "C" NOT NULL,
    username   TEXT COLLATE "C" NOT NULL,
    agent      TEXT COLLATE "C" NOT NULL,
    slot       BIGINT   NOT NULL,
    nonce      TEXT     NOT NULL,
    mechanism  TEXT     NOT NULL,
    expires_at BIGINT   NOT NULL, -- milliseconds since the Unix epoch
    PRIMARY KEY (domain, username, agent, slot),
    FOREIGN KEY (domain, username) REFERENCES accounts (domain, username) ON DELETE CASCADE
);
