-- Accounts and their SCRAM credentials (one row per hash function).
-- Passwords are never stored (RFC 5802 §3: StoredKey and ServerKey only).
-- Key columns use the "C" collation: byte order, as in SQLite, so sorting
-- and keyset pagination do not depend on the server's locale.
CREATE TABLE accounts (
    domain     TEXT COLLATE "C" NOT NULL,
    username   TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL, -- seconds since the Unix epoch
    PRIMARY KEY (domain, username)
);

CREATE TABLE account_credentials (
    domain     TEXT COLLATE "C" NOT NULL,
    username   TEXT COLLATE "C" NOT NULL,
    hash       TEXT   NOT NULL,
    salt       BYTEA  NOT NULL,
    iterations BIGINT NOT NULL,
    stored_key BYTEA  NOT NULL,
    server_key BYTEA  NOT NULL,
    PRIMARY KEY (domain, username, hash),
    FOREIGN KEY (domain, username) REFERENCES accounts (domain, username) ON DELETE CASCADE
);
