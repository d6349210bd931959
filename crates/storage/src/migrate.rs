//! Versioned schema migrations: each backend lists its migrations in order;
//! applied ones are recorded in `starling_schema` and never re-run. A
//! database newer than the build is refused rather than silently used.

/// One schema step.
pub struct Migration {
    /// Strictly increasing version.
    pub version: i64,
    /// Short name for logs.
    pub name: &'static str,
    /// The SQL (may hold several statements).
    pub sql: &'static str,
}
