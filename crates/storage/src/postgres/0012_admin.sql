-- The admin API (docs/admin.md): bearer tokens, stored as the SHA-256 of
-- the token only (the token itself is shown once, by `starling admin
-- token create`), and a flag that bans an account: a disabled account
-- cannot authenticate (RFC 6120 §6.5.1 <account-disabled/>).
CREATE TABLE admin_tokens (
    name         TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    token_hash   BYTEA  NOT NULL, -- SHA-256 of the token
    created_at   BIGINT NOT NULL, -- milliseconds since the Unix epoch
    last_used_at BIGINT,          -- milliseconds since the Unix epoch
    scope        TEXT   NOT NULL DEFAULT 'admin' -- 'admin' or 'read'
);

ALTER TABLE accounts ADD COLUMN disabled BOOLEAN NOT NULL DEFAULT FALSE;
