//! The PostgreSQL backend: a connection pool to one database, shared by
//! every node of a deployment. Same traits and same semantics as
//! [`crate::sqlite`]; concurrency that SQLite gets from its single writer
//! is made explicit here (row locks and per-owner advisory locks, see
//! [`PostgresStorage::lock_owner`]).
//!
//! Migrations (`000N_*.sql` in this directory) are the steps of
//! [`crate::migrate`], with the same versions and names as SQLite's, so
//! `starling_schema` means the same thing on both.
//! They are applied at start-up in one transaction under an advisory lock,
//! so nodes starting together neither race nor see a half-migrated schema.

pub mod admin;
mod dialect;
/// The stores written once for both engines; see [`crate::dialect`].
#[path = "../shared/mod.rs"]
#[allow(
    clippy::duplicate_mod,
    reason = "compiled once per backend on purpose, see crate::dialect"
)]
mod shared;

use crate::migrate;
use crate::{now_secs, split, OpenError};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use starling_core::storage::{SchemaStep, StorageBackend};
use starling_proto::BareJid;
use std::str::FromStr;
use std::time::Duration;

/// This backend, for the shared stores (`shared/`).
type Store = PostgresStorage;

/// The SQL of each schema step ([`crate::migrate`]).
const MIGRATIONS: migrate::Scripts = [
    include_str!("0001_accounts.sql"),
    include_str!("0002_im.sql"),
    include_str!("0003_offline.sql"),
    include_str!("0004_archive.sql"),
    include_str!("0005_inbox_unindexed.sql"),
    include_str!("0006_fast_tokens.sql"),
    include_str!("0007_archive_buckets.sql"),
    include_str!("0009_inbox_groups.sql"),
    include_str!("0011_pubsub.sql"),
    include_str!("0012_admin.sql"),
    include_str!("0013_domains.sql"),
    include_str!("0014_inbox_log.sql"),
    include_str!("0015_archive_owner_buckets.sql"),
    include_str!("0016_account_changes.sql"),
];

/// Advisory lock (one-`bigint` key space) held by the migration runner:
/// the ASCII bytes of "STARLING".
const MIGRATION_LOCK: i64 = 0x5354_4152_4c49_4e47;

/// Classes of per-owner advisory locks (two-`int4` key space, which never
/// overlaps the one-`bigint` space of [`MIGRATION_LOCK`]). One class per
/// concern that needs "check, then write" atomicity for an owner.
#[derive(Clone, Copy, Debug)]
#[repr(i32)]
pub(crate) enum OwnerLock {
    /// Offline queue: quota check and insert.
    Offline = 1,
}

/// How long opening the first connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The PostgreSQL backend.
#[derive(Clone)]
pub struct PostgresStorage {
    pub(crate) pool: PgPool,
    /// Where writes go: the same pool (PostgreSQL has no single-writer
    /// rule; the SQLite backend gives its writes a connection of their own).
    pub(crate) writer: PgPool,
    target: String,
    /// When to open the next archive bucket ([`crate::buckets`]).
    pub(crate) buckets: std::sync::Arc<crate::buckets::BucketWriter>,
}

/// `url` parsed into connection options. PostgreSQL's own environment
/// variables (`PGPASSWORD`, `PGSSLMODE`…) and `~/.pgpass` fill what the URL
/// leaves out.
pub fn connect_options(url: &str) -> Result<PgConnectOptions, OpenError> {
    if url.trim().is_empty() {
        return Err(OpenError::Config(
            "no PostgreSQL URL: set [storage] url (or the STARLING_DATABASE_URL environment variable), e.g. postgres://starling@127.0.0.1/starling".into(),
        ));
    }
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(OpenError::Config(format!(
            "{} is not a PostgreSQL URL: write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require]",
            redacted_url(url)
        )));
    }
    PgConnectOptions::from_str(url).map_err(|e| {
        OpenError::Config(format!(
            "{} is not a valid PostgreSQL URL ({e}): write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require]",
            redacted_url(url)
        ))
    })
}

/// `url` without its password, for logs and error messages.
pub fn redacted_url(url: &str) -> String {
    match PgConnectOptions::from_str(url) {
        Ok(o) => describe(&o),
        // Keep only the scheme and host part after the last '@'.
        Err(_) => match (url.split_once("://"), url.rsplit_once('@')) {
            (Some((scheme, _)), Some((_, host))) => format!("{scheme}://…@{host}"),
            _ => url.split('?').next().unwrap_or("").to_owned(),
        },
    }
}

fn describe(o: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap_or(o.get_username())
    )
}

/// What an operator should check after `e` while connecting or setting up.
fn hint(e: &sqlx::Error) -> &'static str {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "Is the PostgreSQL server running and listening on that host and port (listen_addresses and port in postgresql.conf)?"
        }
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => {
            "Check the host name, the port and any firewall between this node and the database server."
        }
        sqlx::Error::Tls(_) => {
            "TLS failed: check sslmode (disable, prefer, require, verify-ca, verify-full) and sslrootcert in the URL."
        }
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("3D000") => {
                "The database does not exist: create it owned by the Starling user, e.g. `createdb -O starling starling` as the postgres user."
            }
            Some("28P01") | Some("28000") => {
                "Authentication failed: check the user name and password (in the URL, PGPASSWORD or ~/.pgpass) and pg_hba.conf on the server."
            }
            Some("42501") => {
                "Permission denied: the Starling user must own the database (`ALTER DATABASE … OWNER TO …`) or have CREATE on schema public."
            }
            Some("53300") => "The server has no free connection slots: lower [storage] pool_size or raise max_connections.",
            _ => "Check that the server is running, the database exists and the user may connect.",
        },
        _ => "Check that the server is running, the database exists and the user may connect.",
    }
}

impl PostgresStorage {
    /// Connects to the database at `url` with a pool of `pool_size`
    /// connections and applies pending migrations.
    pub async fn open(url: &str, pool_size: u32) -> Result<Self, OpenError> {
        Self::open_with(url, pool_size, &crate::OpenOptions::default()).await
    }

    /// [`PostgresStorage::open`] with non-default [`crate::OpenOptions`].
    pub async fn open_with(
        url: &str,
        pool_size: u32,
        options: &crate::OpenOptions,
    ) -> Result<Self, OpenError> {
        let opts = connect_options(url)?;
        let target = describe(&opts);
        let fail = |source: sqlx::Error| OpenError::Postgres {
            target: target.clone(),
            hint: hint(&source),
            source,
        };
        // One direct connection first: the pool would retry a refused
        // connection until its timeout and then report only the timeout.
        let first = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&opts))
            .await
            .map_err(|_| fail(sqlx::Error::PoolTimedOut))?
            .map_err(fail)?;
        let pool = PgPoolOptions::new()
            .max_connections(pool_size.max(1))
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(opts);
        let db = PostgresStorage {
            writer: pool.clone(),
            pool,
            target: target.clone(),
            buckets: std::sync::Arc::new(crate::buckets::BucketWriter::new(options)),
        };
        db.migrate(first, &options.schema).await?;
        Ok(db)
    }

    /// Applies pending migrations on `conn`, in one transaction holding
    /// [`MIGRATION_LOCK`]: concurrent starters wait, then find nothing to do.
    async fn migrate(&self, mut conn: PgConnection, extra: &[SchemaStep]) -> Result<(), OpenError> {
        let fail = |source: sqlx::Error| OpenError::Postgres {
            target: self.target.clone(),
            hint: hint(&source),
            source,
        };
        let mut tx = conn.begin().await.map_err(fail)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS starling_schema (
                version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
        let applied: std::collections::HashSet<i64> =
            sqlx::query_scalar("SELECT version FROM starling_schema")
                .fetch_all(&mut *tx)
                .await
                .map_err(fail)?
                .into_iter()
                .collect();
        let plan = migrate::plan(&MIGRATIONS, extra, migrate::Engine::Postgres)?;
        for m in migrate::pending(plan, &applied)? {
            if !applied.is_empty() {
                // An existing database: a step may rebuild an index over
                // the whole archive; say so before the wait.
                tracing::info!(version = m.version, name = m.name, db = %self.target, "applying schema migration (minutes on a large archive)");
            }
            let err = |source| OpenError::Migration {
                version: m.version,
                name: m.name,
                source,
            };
            sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(err)?;
            sqlx::query(
                "INSERT INTO starling_schema (version, name, applied_at) VALUES ($1, $2, $3)",
            )
            .bind(m.version)
            .bind(m.name)
            .bind(now_secs())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            tracing::info!(version = m.version, name = m.name, db = %self.target, "applied schema migration");
        }
        tx.commit().await.map_err(fail)?;
        let _ = conn.close().await;
        Ok(())
    }

    /// Takes `owner`'s advisory lock of `class` until the end of the
    /// transaction `tx`. Writers of the same owner and class queue here;
    /// other owners are not affected (a hash collision only costs some
    /// waiting). Use it where a write depends on a read, such as a quota.
    pub(crate) async fn lock_owner(
        tx: &mut PgConnection,
        class: OwnerLock,
        owner: &BareJid,
    ) -> Result<(), sqlx::Error> {
        let (domain, user) = split(owner);
        // '@' cannot occur in a localpart or a domain: the key is unambiguous.
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2 || '@' || $3))")
            .bind(class as i32)
            .bind(user)
            .bind(domain)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl StorageBackend for PostgresStorage {
    async fn close(&self) {
        self.pool.close().await;
    }

    fn describe(&self) -> String {
        self.target.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_password() {
        let shown =
            redacted_url("postgres://starling:hunter2@db.example:6543/xmpp?sslmode=require");
        assert_eq!(shown, "postgres://starling@db.example:6543/xmpp");
        assert!(!redacted_url("postgres://u:hunter2@[bad").contains("hunter2"));
    }

    #[test]
    fn bad_urls_are_config_errors_with_the_expected_form() {
        for url in ["", "mysql://x@y/z", "postgres://u:hunter2@h:notaport/db"] {
            match connect_options(url) {
                Err(OpenError::Config(msg)) => {
                    assert!(msg.contains("postgres://"), "{msg}");
                    assert!(!msg.contains("hunter2"), "{msg}");
                }
                Err(other) => panic!("{url}: unexpected {other}"),
                Ok(_) => panic!("{url}: accepted"),
            }
        }
    }

    #[tokio::test]
    async fn refused_connection_explains_what_to_check() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let url = format!("postgres://starling:hunter2@127.0.0.1:{port}/starling");
        let err = PostgresStorage::open(&url, 1)
            .await
            .err()
            .expect("nothing listens there")
            .to_string();
        assert!(
            err.contains(&format!("starling@127.0.0.1:{port}/starling")),
            "{err}"
        );
        assert!(err.contains("running"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
