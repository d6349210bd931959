//! Run results: the JSON shape, merging of worker results, the saturation
//! and cost computations, and the human table.
//!
//! This file holds the run's JSON shape ([`RunResult`] and the sections
//! every ramp shares); `scenarios.rs` the sections of the other
//! scenarios; `stats.rs` the merging, saturation and cost computations;
//! `table.rs` the human table.

mod scenarios;
mod stats;
mod table;

pub use scenarios::{
    ArchiveResult, CreationResult, FillResult, JoinResult, MucLightResult, MucResult,
    MucStepResult, PepFanout, PepMemory, PepResult, PepSetup, PhaseStats, QueryKindResult,
    ResumeResult, RoomLayout, RoomMemory, RoomRampResult, RssWindow, SlotStats, TransferStats,
    UploadPhase, UploadResult, WarmupResult,
};
pub use stats::{cost_per_billion, saturation, saturation_of, RampPoint};
pub use table::human_bytes;

use crate::hist::LatencySummary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One run, as printed with `--json` (one object per line).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// Always `"starling-bench"`.
    pub tool: String,
    /// Tool version.
    pub version: String,
    /// `connect`, `idle`, `o2o`, `archive`, `resume`, `muc`, `muc-light`,
    /// `pep` or `upload`.
    pub scenario: String,
    /// Unix time (s) the run started.
    pub started_unix: u64,
    /// What was benchmarked.
    pub target: TargetInfo,
    /// Number of users (sessions) requested.
    pub users: u64,
    /// Processes that generated load (1 = no workers).
    pub workers: u32,
    /// Session establishment (every scenario starts with it).
    pub connect: ConnectResult,
    /// `idle` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleResult>,
    /// `o2o` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub o2o: Option<O2oResult>,
    /// Cost per billion delivered messages, when `--hourly-price` was given
    /// and messages were delivered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostResult>,
    /// `archive` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveResult>,
    /// XEP-0198 traffic, with `--sm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm: Option<SmResult>,
    /// `resume` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeResult>,
    /// `muc` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub muc: Option<MucResult>,
    /// `muc-light` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub muc_light: Option<MucLightResult>,
    /// `pep` only (`connect` is the measured login storm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pep: Option<PepResult>,
    /// `upload` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadResult>,
}

/// The server and how the tool talked to it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TargetInfo {
    /// Free-form label (`--label`), e.g. `starling 0.1.0`.
    pub label: String,
    /// Host:port.
    pub address: String,
    /// XMPP domain.
    pub domain: String,
    /// `plain`, `starttls` or `direct`.
    pub tls: String,
    /// SASL mechanism name.
    pub mechanism: String,
    /// Local source addresses used.
    pub sources: Vec<String>,
}

/// Session establishment.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectResult {
    /// Sessions attempted.
    pub attempted: u64,
    /// Sessions fully established (authenticated, bound).
    pub established: u64,
    /// Failed attempts.
    pub failed: u64,
    /// Failures by cause (`connect`, `tls`, `stream`, `auth`, `bind`,
    /// `timeout`, `closed`).
    pub failures: BTreeMap<String, u64>,
    /// One example error message, for diagnosis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Wall-clock window of the storm (unix ms).
    pub started_unix_ms: u64,
    /// End of the storm (unix ms).
    pub finished_unix_ms: u64,
    /// Length of the storm, s.
    pub duration_s: f64,
    /// Established sessions per second over the storm.
    pub sessions_per_s: f64,
    /// Time from TCP connect to bound session.
    pub setup_latency: LatencySummary,
    /// CPU seconds the server process used during the storm (when its PID
    /// is known, i.e. `idle`, or `--server-pid`; single process only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_s: Option<f64>,
    /// CPU seconds the load generator used during the storm (all processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_s: Option<f64>,
}

/// Server memory for idle sessions.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IdleResult {
    /// The measured process.
    pub server_pid: u32,
    /// VmRSS before any session, KiB.
    pub rss_before_kb: u64,
    /// VmRSS with all sessions established and idle, KiB.
    pub rss_after_kb: u64,
    /// Sessions held while measuring.
    pub sessions: u64,
    /// (after − before) / sessions, KiB.
    pub kb_per_session: f64,
    /// The anonymous part of `kb_per_session` (`RssAnon`: heap and stacks).
    #[serde(default)]
    pub anon_kb_per_session: Option<f64>,
    /// The file-backed part of `kb_per_session` (`RssFile`: pages of
    /// mapped files, such as a database read through a memory map —
    /// reclaimable page cache, not memory the sessions hold).
    #[serde(default)]
    pub file_kb_per_session: Option<f64>,
    /// Seconds waited after the last session before measuring.
    pub settle_secs: f64,
}

/// One-to-one chat ramp.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct O2oResult {
    /// Seconds per ramp step.
    pub step_secs: f64,
    /// p99 latency bound for a step to count as keeping up, ms.
    pub p99_bound_ms: f64,
    /// Delivery ratio a step needs to count as keeping up.
    pub min_delivery_ratio: f64,
    /// Seconds waited after the last step for late deliveries.
    pub drain_secs: f64,
    /// The ramp.
    pub steps: Vec<StepResult>,
    /// Highest step that kept up.
    pub saturation: Saturation,
}

/// One ramp step. Messages are attributed to the step in which they were
/// sent (the send time travels in the body), wherever they arrive.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepResult {
    /// Target total rate, msg/s.
    pub target_rate: f64,
    /// Messages sent.
    pub sent: u64,
    /// Of those, delivered to their recipient.
    pub delivered: u64,
    /// Messages that arrived during this step, whenever they were sent:
    /// what the server delivered while this step's load was offered (past
    /// the saturation point, `delivered` also pays for the backlog of the
    /// steps before; this does not).
    #[serde(default)]
    pub arrived: u64,
    /// Error stanzas received for messages of this step.
    pub errors: u64,
    /// Messages the client could not queue (its own backlog was full).
    pub client_dropped: u64,
    /// sent / step length.
    pub sent_per_s: f64,
    /// delivered / step length.
    pub delivered_per_s: f64,
    /// arrived / step length.
    #[serde(default)]
    pub arrived_per_s: f64,
    /// delivered / sent.
    pub delivery_ratio: f64,
    /// Send-to-receive latency.
    pub latency: LatencySummary,
    /// Whether this step kept up (ratio, p99 bound, client reached ≥ 90 %
    /// of the target rate).
    pub ok: bool,
    /// Server CPU use during the step, % of one core (when its PID is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_pct: Option<f64>,
    /// Load generator CPU use during the step, % of one core (all processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_pct: Option<f64>,
}

/// The saturation point of a ramp.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Saturation {
    /// True if some step failed after the last good one (so the server
    /// saturated inside the ramp); false if every step kept up (the real
    /// limit is higher than the ramp) or none did.
    pub reached: bool,
    /// Target rate of the highest step that kept up (0 if none).
    pub rate: f64,
    /// Delivered msg/s at that step.
    pub delivered_per_s: f64,
    /// Human explanation.
    pub note: String,
}

/// The seeds' cost metric.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CostResult {
    /// Instance price per hour (currency of the caller's choice).
    pub hourly_price: f64,
    /// Delivered msg/s the cost is computed from (saturation point).
    pub delivered_per_s: f64,
    /// hourly_price / (delivered_per_s × 3600) × 10⁹.
    pub cost_per_billion: f64,
}

/// Stream management traffic of a run (`--sm`), all processes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SmResult {
    /// `<a h/>` sent in answer to the server's `<r/>`.
    pub acks_sent: u64,
    /// `<r/>` sent by the client (every `--sm-ack-every` stanzas).
    pub requests_sent: u64,
    /// `<a h/>` received from the server.
    pub acks_received: u64,
}

impl SmResult {
    /// Sums worker parts.
    pub fn merge(parts: &[SmResult]) -> SmResult {
        parts.iter().fold(SmResult::default(), |a, p| SmResult {
            acks_sent: a.acks_sent + p.acks_sent,
            requests_sent: a.requests_sent + p.requests_sent,
            acks_received: a.acks_received + p.acks_received,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hist::Latency;

    pub(super) fn lat(values: &[u64]) -> LatencySummary {
        let mut h = Latency::new();
        for v in values {
            h.record_us(*v);
        }
        h.summary()
    }

    pub(super) fn step(rate: f64, sent: u64, delivered: u64, lat_us: u64) -> StepResult {
        StepResult {
            target_rate: rate,
            sent,
            delivered,
            latency: lat(&vec![lat_us; delivered as usize]),
            ..StepResult::default()
        }
    }

    pub(super) fn o2o(steps: Vec<StepResult>) -> O2oResult {
        let mut o = O2oResult {
            step_secs: 10.0,
            p99_bound_ms: 100.0,
            min_delivery_ratio: 0.99,
            drain_secs: 2.0,
            steps,
            saturation: Saturation::default(),
        };
        o.finalize();
        o
    }

    #[test]
    fn json_shape_is_stable() {
        let mut r = RunResult {
            tool: "starling-bench".into(),
            version: "0.1.0".into(),
            scenario: "o2o".into(),
            users: 4,
            workers: 1,
            o2o: Some(o2o(vec![step(100.0, 1000, 1000, 1_000)])),
            ..RunResult::default()
        };
        r.compute_cost(Some(0.5));
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        for key in [
            "tool",
            "version",
            "scenario",
            "started_unix",
            "target",
            "users",
            "workers",
            "connect",
            "o2o",
            "cost",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!(v.get("idle").is_none(), "absent sections are omitted");
        for key in ["address", "domain", "tls", "mechanism", "label", "sources"] {
            assert!(v["target"].get(key).is_some(), "missing target.{key}");
        }
        for key in [
            "attempted",
            "established",
            "failed",
            "failures",
            "duration_s",
            "sessions_per_s",
            "setup_latency",
        ] {
            assert!(v["connect"].get(key).is_some(), "missing connect.{key}");
        }
        let s = &v["o2o"]["steps"][0];
        for key in [
            "target_rate",
            "sent",
            "delivered",
            "sent_per_s",
            "delivered_per_s",
            "delivery_ratio",
            "ok",
        ] {
            assert!(s.get(key).is_some(), "missing step.{key}");
        }
        for key in [
            "count",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "max_ms",
            "hdr_v2_base64",
        ] {
            assert!(s["latency"].get(key).is_some(), "missing latency.{key}");
        }
        assert_eq!(v["o2o"]["saturation"]["rate"], 100.0);
        assert!(v["cost"]["cost_per_billion"].as_f64().unwrap() > 0.0);
        // And it round-trips (workers send exactly this to the coordinator).
        let back: RunResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }
}
