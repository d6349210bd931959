//! Versioned schema migrations: the backend's own steps (version and name,
//! the same on every backend by construction; each backend gives the SQL
//! of each in its directory, `000N_*.sql`) and the steps of modules that
//! keep their own tables ([`SchemaStep`]s, given at open in
//! [`crate::OpenOptions::schema`]). Versions are global: one list, applied
//! in version order. Applied steps are recorded in `starling_schema`, one
//! row each, and never re-run; a step missing from an existing database
//! (a module's step the first time a build knows it) is applied then. A
//! database with a version newer than every step of the build is refused
//! rather than silently used.

use crate::OpenError;
use starling_core::storage::SchemaStep;
use std::collections::{BTreeMap, HashSet};

/// The backend's own schema steps, by version. A new step of a concern
/// kept here takes the next unused version (across modules' steps too:
/// 8 and 10 are the group-chat module's, `modules/muc/store/`; 17 the
/// last-activity module's, `modules/last/store/`; 18 the blocking
/// module's, `modules/blocking/store/`), and its script goes to both
/// backends' [`Scripts`].
const STEPS: [(i64, &str); 14] = [
    (1, "accounts"),
    (2, "im-core"),
    (3, "offline"),
    (4, "archive-inbox"),
    (5, "inbox-unindexed"),
    (6, "fast-tokens"),
    (7, "archive-buckets"),
    (9, "inbox-groups"),
    (11, "pubsub"),
    (12, "admin"),
    (13, "domains"),
    (14, "inbox-log"),
    (15, "archive-owner-buckets"),
    (16, "account-changes"),
];

/// A backend's SQL for each of [`STEPS`], in order (may hold several
/// statements each).
pub(crate) type Scripts = [&'static str; STEPS.len()];

/// Which engine's script of a module's step to run.
#[derive(Clone, Copy)]
pub(crate) enum Engine {
    Sqlite,
    Postgres,
}

/// One schema step.
pub(crate) struct Migration {
    /// Its version.
    pub version: i64,
    /// Short name for logs.
    pub name: &'static str,
    /// The engine's SQL.
    pub sql: &'static str,
}

/// Every step, the backend's (`scripts`) and the modules' (`extra`), in
/// version order; two steps with one version are refused (a build error
/// in all but name: the test `schema_versions_are_unique` of the server
/// catches it first).
pub(crate) fn plan(
    scripts: &'static Scripts,
    extra: &[SchemaStep],
    engine: Engine,
) -> Result<Vec<Migration>, OpenError> {
    let mut all = BTreeMap::new();
    let own = STEPS
        .iter()
        .zip(scripts)
        .map(|(&(version, name), sql)| Migration { version, name, sql });
    let modules = extra.iter().map(|s| Migration {
        version: s.version,
        name: s.name,
        sql: match engine {
            Engine::Sqlite => s.sqlite,
            Engine::Postgres => s.postgres,
        },
    });
    for m in own.chain(modules) {
        if let Some(other) = all.get(&m.version) {
            let other: &Migration = other;
            return Err(OpenError::Config(format!(
                "schema steps {} and {} both claim version {}: give the newer one the next unused version",
                other.name, m.name, m.version
            )));
        }
        all.insert(m.version, m);
    }
    Ok(all.into_values().collect())
}

/// The steps of `plan` not in `applied`, in version order; refused when
/// the database holds a version newer than every step of the plan.
pub(crate) fn pending(
    plan: Vec<Migration>,
    applied: &HashSet<i64>,
) -> Result<Vec<Migration>, OpenError> {
    let supported = plan.last().map_or(0, |m| m.version);
    if let Some(&found) = applied.iter().filter(|&&v| v > supported).max() {
        return Err(OpenError::TooNew { found, supported });
    }
    Ok(plan
        .into_iter()
        .filter(|m| !applied.contains(&m.version))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPTS: Scripts = [""; STEPS.len()];

    fn step(version: i64, name: &'static str) -> SchemaStep {
        SchemaStep {
            version,
            name,
            sqlite: "s",
            postgres: "p",
        }
    }

    #[test]
    fn modules_steps_are_merged_in_version_order() {
        let plan = plan(
            &SCRIPTS,
            &[step(8, "muc"), step(17, "next")],
            Engine::Postgres,
        )
        .unwrap();
        let versions: Vec<i64> = plan.iter().map(|m| m.version).collect();
        assert_eq!(
            versions,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17]
        );
        assert_eq!(plan[7].sql, "p");
    }

    #[test]
    fn a_version_claimed_twice_is_refused() {
        let Err(OpenError::Config(m)) = plan(&SCRIPTS, &[step(9, "mine")], Engine::Sqlite) else {
            panic!("accepted");
        };
        assert!(
            m.contains("inbox-groups and mine both claim version 9"),
            "{m}"
        );
    }

    /// A database made by a build that did not know a module's step gets
    /// that step later, even below its newest version; one newer than the
    /// build is refused.
    #[test]
    fn missing_steps_are_applied_and_newer_databases_refused() {
        let applied: HashSet<i64> = (1..=16).filter(|v| *v != 8 && *v != 10).collect();
        let plan1 = plan(
            &SCRIPTS,
            &[step(8, "muc"), step(10, "light")],
            Engine::Sqlite,
        )
        .unwrap();
        let todo: Vec<i64> = pending(plan1, &applied)
            .unwrap()
            .iter()
            .map(|m| m.version)
            .collect();
        assert_eq!(todo, [8, 10]);
        let newer: HashSet<i64> = (1..=17).collect();
        let plan2 = plan(
            &SCRIPTS,
            &[step(8, "muc"), step(10, "light")],
            Engine::Sqlite,
        )
        .unwrap();
        assert!(matches!(
            pending(plan2, &newer),
            Err(OpenError::TooNew {
                found: 17,
                supported: 16
            })
        ));
    }
}
