-- Accounts and their SCRAM credentials (one row per hash function).
-- Passwords are never stored (RFC 5802 §3: StoredKey and ServerKey only).
CREATE TABLE accounts (
    domain     TEXT    NOT NULL,
    username   TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (domain, username)
) WITHOUT ROWID;

CREATE TABLE account_credentials (
    domain     TEXT    NOT NULL,
    username   TEXT    NOT NULL,
    hash       TEXT    NOT NULL,
    salt       BLOB    NOT NULL,
    iterations INTEGER NOT NULL,
    stored_key BLOB    NOT NULL,
    server_key BLOB    NOT NULL,
    PRIMARY KEY (domain, username, hash),
    FOREIGN KEY (domain, username) REFERENCES accounts (domain, username) ON DELETE CASCADE
) WITHOUT ROWID;
