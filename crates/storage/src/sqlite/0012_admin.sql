-- The admin API (docs/admin.md): bearer tokens, stored as the SHA-256 of
-- the token only (the token itself is shown once, by `starling admin
-- token create`), and a flag that bans an account: a disabled account
-- cannot authenticate (RFC 6120 §6.5.1 <account-disabled/>).
CREATE TABLE admin_tokens (
    name         TEXT    NOT NULL PRIMARY KEY,
    token_hash   BLOB    NOT NULL, -- SHA-256 of the token
    created_at   INTEGER NOT NULL, -- milliseconds since the Unix epoch
    last_used_at INTEGER,          -- milliseconds since the Unix epoch
    scope        TEXT    NOT NULL DEFAULT 'admin' -- 'admin' or 'read'
) WITHOUT ROWID;

ALTER TABLE accounts ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0;
