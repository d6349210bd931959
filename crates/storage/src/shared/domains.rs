//! [`DomainStore`]: domains added at run time. Every write runs in one
//! transaction that first increments the change counter row
//! (`domains_version`), so writers take turns on it and a poller that
//! sees a new counter value sees the change with it.

use super::{Db, Store};
use crate::backend;
use crate::dialect::Dialect;
use async_trait::async_trait;
use sqlx::{Row, Transaction};
use starling_core::storage::{
    DomainSettings, DomainState, DomainStore, StorageError, StorageResult, StoredDomain,
};

/// Increments the change counter inside `tx` and returns its new value.
async fn bump(tx: &mut Transaction<'static, Db>) -> StorageResult<i64> {
    let row = sqlx::query(
        "UPDATE domains_version SET version = version + 1 WHERE id = 1 RETURNING version",
    )
    .fetch_one(&mut **tx)
    .await
    .map_err(backend)?;
    Ok(row.get(0))
}

fn decode(r: &<Db as sqlx::Database>::Row) -> StoredDomain {
    let state: String = r.get(1);
    let settings: String = r.get(2);
    StoredDomain {
        name: r.get(0),
        // An unknown state (a newer node's) is not served here.
        state: DomainState::parse(&state).unwrap_or(DomainState::Disabled),
        settings: DomainSettings::from_json(&settings).unwrap_or_else(|| {
            tracing::warn!(settings, "unreadable domain settings; using none");
            DomainSettings::default()
        }),
        created_at: r.get(3),
        version: r.get(4),
    }
}

impl Store {
    /// Runs `sql` (`$1` the domain's name, `$2` `value`, `$3` the new
    /// change counter) after bumping the counter, in one transaction that
    /// commits only if the domain exists.
    async fn update_domain(
        &self,
        sql: &'static str,
        name: &str,
        value: &str,
    ) -> StorageResult<bool> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        let version = bump(&mut tx).await?;
        let n = sqlx::query(sql)
            .bind(name)
            .bind(value)
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected();
        if n == 0 {
            return Ok(false);
        }
        tx.commit().await.map_err(backend)?;
        Ok(true)
    }
}

#[async_trait]
impl DomainStore for Store {
    async fn add_domain(&self, d: &StoredDomain) -> StorageResult<()> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        let version = bump(&mut tx).await?;
        let n = sqlx::query(
            "INSERT INTO domains (name, state, settings, created_at, version)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(&d.name)
        .bind(d.state.as_str())
        .bind(d.settings.to_json())
        .bind(d.created_at)
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(backend)?
        .rows_affected();
        if n == 0 {
            // Dropping the transaction rolls the counter back too.
            return Err(StorageError::Conflict);
        }
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn domain(&self, name: &str) -> StorageResult<Option<StoredDomain>> {
        let row = sqlx::query(
            "SELECT name, state, settings, created_at, version FROM domains WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.as_ref().map(decode))
    }

    async fn domains(&self) -> StorageResult<Vec<StoredDomain>> {
        let rows = sqlx::query(
            "SELECT name, state, settings, created_at, version FROM domains ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.iter().map(decode).collect())
    }

    async fn set_domain_state(&self, name: &str, state: DomainState) -> StorageResult<bool> {
        self.update_domain(
            "UPDATE domains SET state = $2, version = $3 WHERE name = $1",
            name,
            state.as_str(),
        )
        .await
    }

    async fn set_domain_settings(
        &self,
        name: &str,
        settings: &DomainSettings,
    ) -> StorageResult<bool> {
        self.update_domain(
            "UPDATE domains SET settings = $2, version = $3 WHERE name = $1",
            name,
            &settings.to_json(),
        )
        .await
    }

    async fn delete_domain(&self, name: &str) -> StorageResult<bool> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        bump(&mut tx).await?;
        let n = sqlx::query("DELETE FROM domains WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected();
        if n == 0 {
            return Ok(false);
        }
        tx.commit().await.map_err(backend)?;
        Ok(true)
    }

    async fn domains_version(&self) -> StorageResult<i64> {
        let row = sqlx::query("SELECT version FROM domains_version WHERE id = 1")
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        Ok(row.get(0))
    }
}
