//! Versioned schema migrations: one list of steps (version and name), the
//! same on every backend by construction; each backend gives the SQL of
//! every step (`000N_*.sql` in its directory). Applied steps are recorded
//! in `starling_schema` and never re-run. A database newer than the build
//! is refused rather than silently used.

/// The names of the schema steps; step `i` is version `i + 1`. A new
/// store appends its step here and its script to both backends'
/// [`Scripts`].
const STEPS: [&str; 16] = [
    "accounts",
    "im-core",
    "offline",
    "archive-inbox",
    "inbox-unindexed",
    "fast-tokens",
    "archive-buckets",
    "muc",
    "inbox-groups",
    "muclight-blocking",
    "pubsub",
    "admin",
    "domains",
    "inbox-log",
    "archive-owner-buckets",
    "account-changes",
];

/// A backend's SQL for each of [`STEPS`], in order (may hold several
/// statements each).
pub(crate) type Scripts = [&'static str; STEPS.len()];

/// The highest version this build knows.
pub(crate) const SUPPORTED: i64 = STEPS.len() as i64;

/// One schema step.
pub(crate) struct Migration {
    /// Strictly increasing version.
    pub version: i64,
    /// Short name for logs.
    pub name: &'static str,
    /// The backend's SQL.
    pub sql: &'static str,
}

/// The steps after version `current`, with a backend's `scripts`.
pub(crate) fn pending(scripts: &'static Scripts, current: i64) -> impl Iterator<Item = Migration> {
    STEPS
        .iter()
        .zip(scripts)
        .zip(1..)
        .map(|((name, sql), version)| Migration { version, name, sql })
        .filter(move |m| m.version > current)
}
