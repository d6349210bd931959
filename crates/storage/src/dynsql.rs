//! Statements assembled at run time, shared by both backends. They are
//! built from fixed fragments with every value bound (`QueryBuilder`
//! writes `?` or `$n` placeholders as the backend wants), so the SQLite and
//! PostgreSQL implementations cannot drift apart on paging and filtering.

use crate::split;
use sqlx::{Database, Encode, QueryBuilder, Type};
use starling_core::storage::{ArchiveId, ArchiveQuery, WithFilter};
use starling_proto::BareJid;

/// ` WHERE` conditions of an archive query (everything but limit and
/// direction); with `buckets`, only rows of those buckets
/// ([`crate::buckets`]), which a `with` filter needs to use the
/// by-conversation index.
fn archive_filters<DB>(
    b: &mut QueryBuilder<DB>,
    owner: &BareJid,
    q: &ArchiveQuery,
    buckets: Option<&[i64]>,
) where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let (domain, user) = split(owner);
    b.push(" WHERE ");
    if let Some(buckets) = buckets {
        push_buckets(b, buckets);
    }
    b.push("domain = ").push_bind(domain);
    b.push(" AND username = ").push_bind(user);
    match &q.with {
        None => {}
        Some(WithFilter::Bare(bare)) => {
            b.push(" AND with_bare = ").push_bind(bare.as_str());
        }
        Some(WithFilter::Full { bare, full }) => {
            b.push(" AND with_bare = ").push_bind(bare.as_str());
            b.push(" AND remote = ").push_bind(full.as_str());
        }
    }
    if let Some(a) = q.after {
        b.push(" AND id > ").push_bind(a.0);
    }
    if let Some(bf) = q.before {
        b.push(" AND id < ").push_bind(bf.0);
    }
    if !q.ids.is_empty() {
        b.push(" AND id IN (");
        let mut sep = b.separated(", ");
        for id in &q.ids {
            sep.push_bind(id.0);
        }
        b.push(")");
    }
}

/// `bucket IN (…) AND `: the leading condition of a statement that reads
/// one conversation through the by-conversation index.
fn push_buckets<DB>(b: &mut QueryBuilder<DB>, buckets: &[i64])
where
    DB: Database,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    b.push("bucket IN (");
    let mut sep = b.separated(", ");
    for n in buckets {
        sep.push_bind(*n);
    }
    b.push(") AND ");
}

/// `SELECT columns FROM table WHERE bucket IN (…) AND domain = … AND
/// username = … AND with_bare = …`: the start of a statement over
/// `owner`'s conversation with `with_bare` in `buckets`, read from
/// `table` as in [`archive_page`]; the caller appends its own conditions.
pub(crate) fn conversation<DB>(
    columns: &str,
    table: &str,
    owner: &BareJid,
    with_bare: &str,
    buckets: &[i64],
) -> QueryBuilder<DB>
where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let (domain, user) = split(owner);
    let mut b = QueryBuilder::new("SELECT ");
    b.push(columns).push(" FROM ").push(table).push(" WHERE ");
    push_buckets(&mut b, buckets);
    b.push("domain = ").push_bind(domain);
    b.push(" AND username = ").push_bind(user);
    b.push(" AND with_bare = ").push_bind(with_bare);
    b
}

/// One page of `q`: `id, with_bare, outgoing, flags, stanza`, one row more
/// than the limit (to tell whether the page is complete), in the paging
/// direction, from `table` (`archive`, or the engine's way of saying
/// "archive through its by-conversation index" with `buckets`).
pub(crate) fn archive_page<DB>(
    owner: &BareJid,
    q: &ArchiveQuery,
    table: &str,
    buckets: Option<&[i64]>,
) -> QueryBuilder<DB>
where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut b = QueryBuilder::new("SELECT id, with_bare, outgoing, flags, stanza FROM ");
    b.push(table);
    archive_filters(&mut b, owner, q, buckets);
    b.push(if q.from_end {
        " ORDER BY id DESC LIMIT "
    } else {
        " ORDER BY id ASC LIMIT "
    });
    b.push_bind(i64::from(q.limit) + 1);
    b
}

/// `COUNT(*)` of the messages matching `q` (in `buckets` if given, from
/// `table` as in [`archive_page`]).
pub(crate) fn archive_count<DB>(
    owner: &BareJid,
    q: &ArchiveQuery,
    table: &str,
    buckets: Option<&[i64]>,
) -> QueryBuilder<DB>
where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut b = QueryBuilder::new("SELECT COUNT(*) FROM ");
    b.push(table);
    archive_filters(&mut b, owner, q, buckets);
    b
}

/// The `id`s among `ids` in `owner`'s archive.
pub(crate) fn archive_existing<DB>(owner: &BareJid, ids: &[ArchiveId]) -> QueryBuilder<DB>
where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let q = ArchiveQuery {
        ids: ids.to_vec(),
        ..Default::default()
    };
    let mut b = QueryBuilder::new("SELECT id FROM archive");
    archive_filters(&mut b, owner, &q, None);
    b
}
