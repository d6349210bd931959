//! [`AccountStore`]. Credentials are inserted, and bulk imports run, by
//! each engine's batch writer ([`Dialect::insert_credentials`],
//! [`Dialect::insert_accounts`]); deleting an account deletes its
//! credentials by `ON DELETE CASCADE` (SQLite's foreign keys are on).
//!
//! A password change, a ban or unban and a deletion also record the
//! account in `account_changes` under the next value of the counter row
//! `accounts_version`, in the same transaction ([`commit_change`]), for
//! the servers' authentication caches ([`AccountStore::account_changes`]).

use super::{Db, Dialect, Store};
use crate::{backend, hash_name, now_secs, split};
use async_trait::async_trait;
use sqlx::{Row, Transaction};
use starling_core::storage::{
    AccountChanges, AccountStore, FastSlot, FastToken, StorageError, StorageResult,
    ACCOUNT_CHANGES_KEPT,
};
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;

/// Records a change of account `(domain, user)` in `tx` and commits it:
/// bumps the counter row (writers take turns on it, so change numbers have
/// no gaps and a poller that sees number n sees every change up to n),
/// records the account under the new number and drops what is older than
/// the last [`ACCOUNT_CHANGES_KEPT`].
async fn commit_change(
    mut tx: Transaction<'static, Db>,
    domain: &str,
    user: &str,
) -> StorageResult<()> {
    let version: i64 = sqlx::query(
        "UPDATE accounts_version SET version = version + 1 WHERE id = 1 RETURNING version",
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(backend)?
    .get(0);
    sqlx::query("INSERT INTO account_changes (seq, domain, username) VALUES ($1, $2, $3)")
        .bind(version)
        .bind(domain)
        .bind(user)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    sqlx::query("DELETE FROM account_changes WHERE seq <= $1")
        .bind(version - ACCOUNT_CHANGES_KEPT)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    tx.commit().await.map_err(backend)
}

#[async_trait]
impl AccountStore for Store {
    async fn create(&self, jid: &BareJid, credentials: &[ScramCredentials]) -> StorageResult<()> {
        let (domain, user) = split(jid);
        let mut tx = self.begin_write().await.map_err(backend)?;
        let inserted = sqlx::query(
            "INSERT INTO accounts (domain, username, created_at) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(domain)
        .bind(user)
        .bind(now_secs())
        .execute(&mut *tx)
        .await
        .map_err(backend)?
        .rows_affected();
        if inserted == 0 {
            return Err(StorageError::Conflict);
        }
        Store::insert_credentials(&mut tx, &[(jid, credentials)])
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }

    async fn create_many(
        &self,
        accounts: &[(BareJid, Vec<ScramCredentials>)],
    ) -> StorageResult<u64> {
        self.insert_accounts(accounts).await
    }

    async fn exists(&self, jid: &BareJid) -> StorageResult<bool> {
        let (domain, user) = split(jid);
        let row = sqlx::query("SELECT 1 FROM accounts WHERE domain = $1 AND username = $2")
            .bind(domain)
            .bind(user)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        Ok(row.is_some())
    }

    async fn credentials(
        &self,
        jid: &BareJid,
        hash: ScramHash,
    ) -> StorageResult<Option<ScramCredentials>> {
        let (domain, user) = split(jid);
        let row = sqlx::query(
            "SELECT salt, iterations, stored_key, server_key FROM account_credentials
             WHERE domain = $1 AND username = $2 AND hash = $3",
        )
        .bind(domain)
        .bind(user)
        .bind(hash_name(hash))
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.map(|r| ScramCredentials {
            hash,
            salt: r.get(0),
            iterations: r.get::<i64, _>(1) as u32,
            stored_key: r.get(2),
            server_key: r.get(3),
        }))
    }

    async fn set_credentials(
        &self,
        jid: &BareJid,
        credentials: &[ScramCredentials],
    ) -> StorageResult<bool> {
        let (domain, user) = split(jid);
        let mut tx = self.begin_write().await.map_err(backend)?;
        // Lock the account row: a concurrent delete waits, or wins first.
        let exists = sqlx::query(for_update!(
            "SELECT 1 FROM accounts WHERE domain = $1 AND username = $2"
        ))
        .bind(domain)
        .bind(user)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?
        .is_some();
        if !exists {
            return Ok(false);
        }
        sqlx::query("DELETE FROM account_credentials WHERE domain = $1 AND username = $2")
            .bind(domain)
            .bind(user)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        // A new password revokes every FAST token (XEP-0484 §5: tokens are
        // exchanged for a password, not kept past it).
        sqlx::query("DELETE FROM fast_tokens WHERE domain = $1 AND username = $2")
            .bind(domain)
            .bind(user)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        Store::insert_credentials(&mut tx, &[(jid, credentials)])
            .await
            .map_err(backend)?;
        commit_change(tx, domain, user).await?;
        Ok(true)
    }

    async fn delete(&self, jid: &BareJid) -> StorageResult<bool> {
        let (domain, user) = split(jid);
        let mut tx = self.begin_write().await.map_err(backend)?;
        let n = sqlx::query("DELETE FROM accounts WHERE domain = $1 AND username = $2")
            .bind(domain)
            .bind(user)
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected();
        if n == 0 {
            return Ok(false);
        }
        commit_change(tx, domain, user).await?;
        Ok(true)
    }

    async fn list(
        &self,
        domain: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT username FROM accounts WHERE domain = $1 AND username > $2
             ORDER BY username LIMIT $3",
        )
        .bind(domain)
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    async fn count(&self, domain: &str) -> StorageResult<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM accounts WHERE domain = $1")
            .bind(domain)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?
            .get(0);
        Ok(n as u64)
    }

    async fn set_disabled(&self, jid: &BareJid, disabled: bool) -> StorageResult<bool> {
        let (domain, user) = split(jid);
        let mut tx = self.begin_write().await.map_err(backend)?;
        let n =
            sqlx::query("UPDATE accounts SET disabled = $3 WHERE domain = $1 AND username = $2")
                .bind(domain)
                .bind(user)
                .bind(disabled)
                .execute(&mut *tx)
                .await
                .map_err(backend)?
                .rows_affected();
        if n == 0 {
            return Ok(false);
        }
        commit_change(tx, domain, user).await?;
        Ok(true)
    }

    async fn is_disabled(&self, jid: &BareJid) -> StorageResult<bool> {
        let (domain, user) = split(jid);
        let row = sqlx::query("SELECT disabled FROM accounts WHERE domain = $1 AND username = $2")
            .bind(domain)
            .bind(user)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        Ok(row.is_some_and(|r| r.get::<bool, _>(0)))
    }

    async fn fast_tokens(&self, jid: &BareJid, agent: &str) -> StorageResult<Vec<FastToken>> {
        let (domain, user) = split(jid);
        let rows = sqlx::query(
            "SELECT slot, nonce, mechanism, expires_at FROM fast_tokens
             WHERE domain = $1 AND username = $2 AND agent = $3 ORDER BY slot",
        )
        .bind(domain)
        .bind(user)
        .bind(agent)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                Some(FastToken {
                    slot: FastSlot::from_code(r.get(0))?,
                    nonce: r.get(1),
                    mechanism: r.get(2),
                    expires_at: r.get(3),
                })
            })
            .collect())
    }

    async fn put_fast_token(
        &self,
        jid: &BareJid,
        agent: &str,
        token: &FastToken,
    ) -> StorageResult<bool> {
        let (domain, user) = split(jid);
        // Only for an existing account (the foreign key would refuse it
        // too, as an error rather than an answer).
        let n = sqlx::query(
            "INSERT INTO fast_tokens (domain, username, agent, slot, nonce, mechanism, expires_at)
             SELECT $1, $2, $3, $4, $5, $6, $7
             WHERE EXISTS (SELECT 1 FROM accounts WHERE domain = $1 AND username = $2)
             ON CONFLICT (domain, username, agent, slot) DO UPDATE
             SET nonce = excluded.nonce, mechanism = excluded.mechanism,
                 expires_at = excluded.expires_at",
        )
        .bind(domain)
        .bind(user)
        .bind(agent)
        .bind(token.slot.code())
        .bind(&token.nonce)
        .bind(&token.mechanism)
        .bind(token.expires_at)
        .execute(&self.writer)
        .await
        .map_err(backend)?
        .rows_affected();
        Ok(n > 0)
    }

    async fn delete_fast_tokens(
        &self,
        jid: &BareJid,
        agent: &str,
        slot: Option<FastSlot>,
    ) -> StorageResult<()> {
        let (domain, user) = split(jid);
        sqlx::query(
            "DELETE FROM fast_tokens WHERE domain = $1 AND username = $2 AND agent = $3
             AND ($4 < 0 OR slot = $4)",
        )
        .bind(domain)
        .bind(user)
        .bind(agent)
        .bind(slot.map_or(-1, FastSlot::code))
        .execute(&self.writer)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn account_changes(&self, after: i64) -> StorageResult<AccountChanges> {
        let version: i64 = sqlx::query("SELECT version FROM accounts_version WHERE id = 1")
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?
            .get(0);
        if version == after {
            return Ok(AccountChanges {
                version,
                accounts: Some(Vec::new()),
            });
        }
        // Behind by more than is kept, or ahead (a restored database).
        if after > version || version - after > ACCOUNT_CHANGES_KEPT {
            return Ok(AccountChanges {
                version,
                accounts: None,
            });
        }
        let rows = sqlx::query(
            "SELECT domain, username FROM account_changes WHERE seq > $1 AND seq <= $2",
        )
        .bind(after)
        .bind(version)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        // Every number up to `version` is committed (writers take turns on
        // the counter row); fewer rows means some were dropped already.
        let accounts = (rows.len() as i64 == version - after).then(|| {
            rows.iter()
                .filter_map(|r| {
                    let (domain, user): (&str, &str) = (r.get(0), r.get(1));
                    let jid = if user.is_empty() {
                        BareJid::new(domain)
                    } else {
                        BareJid::new(&format!("{user}@{domain}"))
                    };
                    jid.ok()
                })
                .collect()
        });
        Ok(AccountChanges { version, accounts })
    }
}
