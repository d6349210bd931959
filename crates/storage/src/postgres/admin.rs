//! Database administration through an administrator URL: creating and
//! dropping whole databases, for the test suites (a fresh database per test)
//! and for tooling.
//!
//! `CREATE DATABASE` and `DROP DATABASE` take no bound parameters, so the
//! name is the one value formatted into SQL here: it must match
//! `[a-z_][a-z0-9_]*` (at most 63 bytes) and is quoted as an identifier.
//! Everything else stays bound.

use super::{connect_options, hint};
use crate::OpenError;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};

/// Checks that `name` is a plain database name (see the module doc).
pub fn check_name(name: &str) -> Result<(), OpenError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(OpenError::Config(format!(
            "{name:?} is not a plain database name: use lower-case letters, digits and '_' (at most 63)"
        )))
    }
}

/// `url` with its database replaced by `name` (user, password, host and
/// query parameters kept).
pub fn with_database(url: &str, name: &str) -> Result<String, OpenError> {
    check_name(name)?;
    connect_options(url)?;
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path = base[authority..]
        .find('/')
        .map(|i| authority + i)
        .unwrap_or(base.len());
    let mut out = format!("{}/{name}", &base[..path]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

async fn admin(admin_url: &str) -> Result<PgConnection, OpenError> {
    let opts = connect_options(admin_url)?;
    PgConnection::connect_with(&opts)
        .await
        .map_err(|source| OpenError::Postgres {
            target: super::describe(&opts),
            hint: hint(&source),
            source,
        })
}

fn failed(admin_url: &str, source: sqlx::Error) -> OpenError {
    OpenError::Postgres {
        target: super::redacted_url(admin_url),
        hint: hint(&source),
        source,
    }
}

/// Creates the empty database `name` (nothing happens if it exists) and
/// returns its URL, derived from `admin_url`.
pub async fn create_database(admin_url: &str, name: &str) -> Result<String, OpenError> {
    let url = with_database(admin_url, name)?;
    let mut conn = admin(admin_url).await?;
    let exists = sqlx::query("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(&mut conn)
        .await
        .map_err(|e| failed(admin_url, e))?
        .is_some();
    if !exists {
        match sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
        {
            Ok(_) => {}
            // Created concurrently by someone else: fine.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(failed(admin_url, e)),
        }
    }
    let _ = conn.close().await;
    Ok(url)
}

/// Drops the database `name` if it exists, closing its connections.
pub async fn drop_database(admin_url: &str, name: &str) -> Result<(), OpenError> {
    check_name(name)?;
    let mut conn = admin(admin_url).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await
    .map_err(|e| failed(admin_url, e))?;
    let _ = conn.close().await;
    Ok(())
}

/// Names of the databases starting with `prefix`.
pub async fn databases_with_prefix(
    admin_url: &str,
    prefix: &str,
) -> Result<Vec<String>, OpenError> {
    let mut conn = admin(admin_url).await?;
    let rows = sqlx::query(
        "SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY datname",
    )
    .bind(prefix)
    .fetch_all(&mut conn)
    .await
    .map_err(|e| failed(admin_url, e))?;
    let _ = conn.close().await;
    Ok(rows.into_iter().map(|r| r.get(0)).collect())
}

/// Attaches a free-form label to the database at `url` (a one-row table
/// `starling_label`), e.g. which test directory it belongs to.
pub async fn set_label(url: &str, label: &str) -> Result<(), OpenError> {
    let mut conn = admin(url).await?;
    let mut tx = conn.begin().await.map_err(|e| failed(url, e))?;
    for q in [
        sqlx::query("CREATE TABLE IF NOT EXISTS starling_label (label TEXT NOT NULL)"),
        sqlx::query("DELETE FROM starling_label"),
        sqlx::query("INSERT INTO starling_label (label) VALUES ($1)").bind(label),
    ] {
        q.execute(&mut *tx).await.map_err(|e| failed(url, e))?;
    }
    tx.commit().await.map_err(|e| failed(url, e))?;
    let _ = conn.close().await;
    Ok(())
}

/// The label of the database at `url`, `None` if it has none (yet).
pub async fn label(url: &str) -> Result<Option<String>, OpenError> {
    let mut conn = admin(url).await?;
    let has_table = sqlx::query("SELECT to_regclass('starling_label') IS NOT NULL")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| failed(url, e))?
        .get::<bool, _>(0);
    let label = if has_table {
        sqlx::query("SELECT label FROM starling_label LIMIT 1")
            .fetch_optional(&mut conn)
            .await
            .map_err(|e| failed(url, e))?
            .map(|r| r.get(0))
    } else {
        None
    };
    let _ = conn.close().await;
    Ok(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_checked_before_any_sql() {
        for good in ["starling_test_abc123", "_x", "a"] {
            check_name(good).unwrap();
        }
        for bad in [
            "",
            "Upper",
            "1abc",
            "x\"; DROP DATABASE postgres; --",
            "with space",
            &"a".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn database_is_replaced_in_urls() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:55432/postgres", "t1").unwrap(),
            "postgres://postgres@127.0.0.1:55432/t1"
        );
        assert_eq!(
            with_database("postgres://u:p@h", "t1").unwrap(),
            "postgres://u:p@h/t1"
        );
        assert_eq!(
            with_database("postgresql://u@h:5/db?sslmode=require", "t1").unwrap(),
            "postgresql://u@h:5/t1?sslmode=require"
        );
    }
}
