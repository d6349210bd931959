-- Changes of accounts that authentication caches hold (the server's
-- AuthCache: SCRAM credentials, disabled state): a password change, a
-- ban or unban, a deletion. Each bumps the single counter row and records
-- the account under the counter's new value, in the writer's transaction;
-- every node polls the counter (one primary-key read every 2 s) and
-- forgets the accounts recorded since its last poll. The writer keeps the
-- last 10,000 changes; a node further behind forgets everything.
CREATE TABLE accounts_version (
    id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO accounts_version (id, version) VALUES (1, 0);

CREATE TABLE account_changes (
    seq      INTEGER NOT NULL PRIMARY KEY,
    domain   TEXT    NOT NULL,
    username TEXT    NOT NULL
);
