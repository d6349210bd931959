//! [`AdminTokenStore`]: the admin API's bearer tokens, as SHA-256 hashes.

use super::Store;
use crate::backend;
use async_trait::async_trait;
use sqlx::Row;
use starling_core::storage::{AdminToken, AdminTokenStore, StorageError, StorageResult};

#[async_trait]
impl AdminTokenStore for Store {
    async fn create_admin_token(&self, token: &AdminToken) -> StorageResult<()> {
        let n = sqlx::query(
            "INSERT INTO admin_tokens (name, token_hash, created_at, last_used_at, scope)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(&token.name)
        .bind(&token.hash)
        .bind(token.created_at)
        .bind(token.last_used_at)
        .bind(&token.scope)
        .execute(&self.writer)
        .await
        .map_err(backend)?
        .rows_affected();
        if n == 0 {
            return Err(StorageError::Conflict);
        }
        Ok(())
    }

    async fn admin_tokens(&self) -> StorageResult<Vec<AdminToken>> {
        let rows = sqlx::query(
            "SELECT name, token_hash, created_at, last_used_at, scope FROM admin_tokens ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|r| AdminToken {
                name: r.get(0),
                hash: r.get(1),
                created_at: r.get(2),
                last_used_at: r.get(3),
                scope: r.get(4),
            })
            .collect())
    }

    async fn touch_admin_token(&self, name: &str, at: i64) -> StorageResult<()> {
        sqlx::query("UPDATE admin_tokens SET last_used_at = $2 WHERE name = $1")
            .bind(name)
            .bind(at)
            .execute(&self.writer)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn revoke_admin_token(&self, name: &str) -> StorageResult<bool> {
        let n = sqlx::query("DELETE FROM admin_tokens WHERE name = $1")
            .bind(name)
            .execute(&self.writer)
            .await
            .map_err(backend)?
            .rows_affected();
        Ok(n > 0)
    }
}
