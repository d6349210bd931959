//! Run results: the JSON shape, merging of worker results, the saturation
//! and cost computations, and the human table.

use crate::hist::LatencySummary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

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

/// The `upload` scenario (XEP-0363 HTTP File Upload).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct UploadResult {
    /// The upload service's JID.
    pub service: String,
    /// Whether it was found in the domain's disco#items (else `--service`).
    pub discovered: bool,
    /// Its `max-file-size` (disco#info form), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_file_size: Option<u64>,
    /// The content type of the slot requests and PUTs.
    pub content_type: String,
    /// The scheme of the slot URLs (`http`, `https`; empty without slots).
    pub scheme: String,
    /// The server process whose memory and CPU were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pid: Option<u32>,
    /// Interval of the memory samples, ms.
    pub sample_ms: u64,
    /// `big` (one file of `--big-mb`) and/or `parallel` (`--parallel` files
    /// of `--small-kb`), in that order.
    pub phases: Vec<UploadPhase>,
}

/// One phase of the `upload` scenario: slots, then every PUT at once, then
/// every GET at once.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct UploadPhase {
    /// `big` or `parallel`.
    pub name: String,
    /// Files of the phase.
    pub files: u64,
    /// Bytes of each file.
    pub file_bytes: u64,
    /// The slot requests.
    pub slots: SlotStats,
    /// The PUTs (of the slots granted).
    pub upload: TransferStats,
    /// The GETs (of the files uploaded).
    pub download: TransferStats,
    /// Files whose download had exactly the bytes uploaded.
    pub verified: u64,
    /// First slot request → last download done, s.
    pub total_s: f64,
}

/// Slot requests (XEP-0363 §4) of one phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SlotStats {
    /// Requests sent.
    pub requested: u64,
    /// Slots granted.
    pub granted: u64,
    /// Refusals and failures by cause (the error condition,
    /// `file-too-large`, `timeout`, `closed`, `malformed`).
    pub failures: BTreeMap<String, u64>,
    /// One example failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Request sent → slot received (requests of a user are pipelined).
    pub latency: LatencySummary,
    /// All requests, s.
    pub duration_s: f64,
}

/// The PUTs or the GETs of one phase, all started at once.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TransferStats {
    /// Transfers started.
    pub files: u64,
    /// Transfers that succeeded (GET: and the bytes verified).
    pub ok: u64,
    /// Bytes of the files that succeeded.
    pub bytes: u64,
    /// First connect → last transfer over, s.
    pub duration_s: f64,
    /// bytes ÷ duration, MiB/s (1 MiB = 1,048,576 bytes).
    pub mib_per_s: f64,
    /// Per successful file: TCP connect → response complete (PUT: the
    /// server's answer after the whole body; GET: the last byte).
    pub latency: LatencySummary,
    /// Failures by cause (`http-NNN`, `verify`, `length`, `short`,
    /// `connect`, `tls`, `timeout`, `io`, `closed`, `malformed`, `url`).
    pub failures: BTreeMap<String, u64>,
    /// One example failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Server CPU over the transfers, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_s: Option<f64>,
    /// The load generator's CPU over the transfers, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_s: Option<f64>,
    /// The server's memory during the transfers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<RssWindow>,
}

/// The server's VmRSS around and during a transfer, KiB.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RssWindow {
    /// Right before the first transfer started.
    pub before_kb: u64,
    /// The highest sample (before and after included).
    pub max_kb: u64,
    /// Right after the last transfer ended.
    pub after_kb: u64,
    /// max − before.
    pub growth_kb: u64,
    /// Samples taken.
    pub samples: u64,
}

/// The `pep` scenario (XEP-0163 at login): the setup, then a login storm
/// in which every login counts the notifications (the last items of its
/// own nodes and of its contacts') it gets.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PepResult {
    /// Contacts per user (`--contacts`: groups of contacts + 1).
    pub contacts: u64,
    /// Groups the users were split into.
    pub groups: u64,
    /// The nodes every user published one item to.
    pub nodes: Vec<String>,
    /// The XEP-0115 `ver` (sha-1) every session announced.
    pub caps_ver: String,
    /// Logins started per second (`--rate`; 0: all at once).
    pub target_rate: f64,
    /// Once a login got every expected notification, its window closes
    /// after this long without another, ms.
    pub quiet_ms: u64,
    /// A login's window closes this long after its caps presence at the
    /// latest (what has not arrived by then is missing), s.
    #[serde(default)]
    pub window_secs: f64,
    /// Whether the server was shown the sessions' capabilities before the
    /// storm (one login announcing them and answering the server's
    /// disco#info), as a production server knows the common clients'.
    #[serde(default)]
    pub caps_warmed_up: bool,
    /// disco#info queries that warm-up login answered.
    #[serde(default)]
    pub caps_warmup_queries: u64,
    /// The setup (absent with `--skip-setup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<PepSetup>,
    /// Logins of the storm that were established (the storm itself is
    /// the run's `connect` section).
    pub logins: u64,
    /// Notifications the established logins should get: one per node of
    /// every member of their group, their own included.
    pub expected: u64,
    /// Notifications received in the logins' windows (duplicates and
    /// unexpected ones included).
    pub received: u64,
    /// Of `expected`, (publisher, node) pairs that arrived in the window.
    pub received_expected: u64,
    /// expected − received_expected.
    pub missing: u64,
    /// Of `missing`, those whose publisher was online first: the login
    /// itself, or a contact whose caps presence went out before the
    /// login's (by the tool's clock: for logins a few ms apart the
    /// server may have seen them in the other order).
    #[serde(default)]
    pub missing_online_first: u64,
    /// Of `missing`, those whose publisher's caps presence went out after
    /// the login's (or never: its login failed). A server that sends the
    /// last items of online contacts only (ejabberd) misses these.
    #[serde(default)]
    pub missing_later: u64,
    /// A (publisher, node) pair a session had already got, in its window
    /// or after.
    pub duplicates: u64,
    /// Notifications from a publisher or node outside the session's group
    /// and nodes, in its window or after.
    pub unexpected: u64,
    /// Notifications that arrived after the session's window closed
    /// (duplicates and unexpected ones included): what the logins of
    /// others sent to sessions already online.
    pub after_window: u64,
    /// Logins that got every expected notification in their window.
    pub complete_logins: u64,
    /// Sessions the server closed during their window.
    pub closed_in_window: u64,
    /// expected / logins.
    pub expected_per_login: f64,
    /// received / logins.
    pub received_per_login: f64,
    /// XML bytes received per login from the bound session to the end of
    /// its window (presences, notifications, caps queries).
    pub bytes_per_login: f64,
    /// Presence stanzas received per login in its window.
    pub presences_per_login: f64,
    /// Caps disco#info queries the sessions answered (a server asks once
    /// per `ver` it does not know).
    pub caps_queries: u64,
    /// Per login with at least one notification: TCP connect → its last
    /// notification in the window.
    pub latency: LatencySummary,
    /// The same from the caps presence sent (the PEP part of a login).
    pub after_presence_latency: LatencySummary,
    /// First TCP connect → the last window closed, s.
    pub duration_s: f64,
    /// received / duration.
    pub notifications_per_s: f64,
    /// Server CPU per established login over the storm (logins,
    /// notifications, caps), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_ms_per_login: Option<f64>,
    /// Server memory (when its PID is known and readable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<PepMemory>,
    /// The publish fan-out phase after the storm (`--publishes`; absent
    /// when 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout: Option<PepFanout>,
}

/// The `pep` scenario's publish fan-out phase: one publication at a time
/// by an online user, notified to every online session of its group.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PepFanout {
    /// The node published to.
    pub node: String,
    /// Publications asked for (`--publishes`).
    pub publications: u64,
    /// Publish iqs sent (a publication is skipped when its group has no
    /// online session).
    pub sent: u64,
    /// Publish iqs answered with an error.
    pub errors: u64,
    /// Pause between two publications, ms.
    pub interval_ms: u64,
    /// Receivers per publication at the largest: the online sessions of
    /// the publisher's group, its own included.
    pub max_receivers: u64,
    /// Notifications expected: the online sessions of the publisher's
    /// group (its own included) at each publication, summed.
    pub expected: u64,
    /// Of those, received (once per session and publication).
    pub delivered: u64,
    /// The same publication received again by a session.
    pub duplicates: u64,
    /// Publications every expected session got.
    pub complete: u64,
    /// Publish iq sent → each notification (every receiver of every
    /// publication).
    pub latency: LatencySummary,
    /// Publish iq sent → the last receiver's notification, per complete
    /// publication.
    pub last_latency: LatencySummary,
}

/// The `pep` scenario's setup, over XMPP.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PepSetup {
    /// Logging every user in (roster fetched, presence sent).
    pub logins: ConnectResult,
    /// Contacts the layout asks for, over all logged-in users.
    pub contacts_expected: u64,
    /// Of those, mutually subscribed (`both`) at the end.
    pub contacts_both: u64,
    /// Already `both` before the setup (an earlier run).
    pub contacts_already: u64,
    /// `subscribe` presences sent.
    pub subscribes_sent: u64,
    /// Pairs of contacts whose roster items disagreed at the start (one
    /// sees the other's presence, the other does not count it as a
    /// subscriber: an interrupted run, or a server that lost an update):
    /// the item was removed on both sides and the pair subscribed again.
    #[serde(default)]
    pub pairs_reset: u64,
    /// Roster items outside the layout removed (an earlier run's).
    pub stale_items_removed: u64,
    /// Items the users should publish.
    pub publish_expected: u64,
    /// Publications acknowledged.
    pub published: u64,
    /// Refused publications sent again (each at most 9 times, after a
    /// growing pause): what a server refused because of concurrent ones.
    #[serde(default)]
    pub publish_retries: u64,
    /// Nodes of the list beyond `--nodes` deleted (an earlier run's).
    pub stale_nodes_deleted: u64,
    /// Start of the subscriptions → the last user's contacts all `both`, s.
    pub subscribe_s: f64,
    /// Start of the subscriptions → the last user's publications done, s.
    pub publish_s: f64,
    /// The whole setup (logins, subscriptions, publications, logouts), s.
    pub total_s: f64,
    /// Failed steps by cause (`subscribe-timeout`, `publish:<condition>`,
    /// `closed`…).
    pub failures: BTreeMap<String, u64>,
    /// One example failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// The server's memory in the `pep` scenario (`VmRSS`, KiB).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PepMemory {
    /// The measured process.
    pub server_pid: u32,
    /// Before the storm (the setup's sessions closed), after `--settle-secs`.
    pub rss_before_kb: u64,
    /// Every login's window closed, after `--settle-secs`.
    pub rss_after_kb: u64,
    /// (after − before) / logins.
    pub kb_per_session: f64,
}

/// The `muc` scenario (XEP-0045): the join storm, then a ramp of
/// groupchat messages whose every copy (one per occupant, the sender's
/// reflection included) is counted and timed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MucResult {
    /// Service, rooms and senders.
    #[serde(flatten)]
    pub layout: RoomLayout,
    /// `maxstanzas` of the history asked for on entering.
    pub history: u32,
    /// The join storm.
    pub join: JoinResult,
    /// The ramp of groupchat messages.
    #[serde(flatten)]
    pub ramp: RoomRampResult,
}

/// The `muc-light` scenario (MongooseIM's MUC Light,
/// `urn:xmpp:muclight:0`): each room created with its members in one iq,
/// then a ramp of groupchat messages whose every copy (one per member,
/// the sender's included) is counted and timed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MucLightResult {
    /// Always `MUC Light (urn:xmpp:muclight:0)`.
    pub protocol: String,
    /// Service, rooms and senders.
    #[serde(flatten)]
    pub layout: RoomLayout,
    /// Part of every room node (`{room_prefix}-{run_id}-{k}`), so that
    /// every run creates new rooms (empty: `{room_prefix}{k}`).
    pub run_id: String,
    /// Creating the rooms.
    pub creation: CreationResult,
    /// Server memory (when its PID is known and readable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<RoomMemory>,
    /// The ramp of groupchat messages.
    #[serde(flatten)]
    pub ramp: RoomRampResult,
}

/// How a group chat scenario (`muc`, `muc-light`) put its users in rooms.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RoomLayout {
    /// The service, e.g. `conference.localhost` or `muclight.localhost`.
    pub service: String,
    /// Room names start with this prefix and end with the room number
    /// (`bench1@service`, …).
    pub room_prefix: String,
    /// Members per room (`--room-size`; the last room may be smaller).
    pub room_size: u64,
    /// Rooms the users were split into.
    pub rooms: u64,
    /// Members of each room that send (`--senders-per-room`; 0 = all).
    pub senders_per_room: u64,
    /// Senders over all rooms (members of rooms entered or created only).
    pub senders: u64,
}

/// The ramp of groupchat messages of a group chat scenario: every copy
/// (one per member of the message's room, the sender's included) is
/// counted and timed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RoomRampResult {
    /// Seconds per ramp step.
    pub step_secs: f64,
    /// p99 bound (latency of a copy) for a step to keep up, ms.
    pub p99_bound_ms: f64,
    /// Ratio of copies delivered to copies expected for a step to keep up.
    pub min_delivery_ratio: f64,
    /// Seconds waited after the last step for late copies.
    pub drain_secs: f64,
    /// The ramp.
    pub steps: Vec<MucStepResult>,
    /// Highest step that kept up (`delivered_per_s`: delivered copies/s).
    pub saturation: Saturation,
    /// Copies of messages that were no longer expected (an occupant the
    /// tool did not count, or a duplicate).
    pub unexpected_copies: u64,
    /// Error messages from the service over the whole run, by condition
    /// (`not-allowed`, `resource-constraint`…).
    #[serde(default)]
    pub errors_by_condition: BTreeMap<String, u64>,
}

/// What the room setup phases (the `muc` join storm, the `muc-light` room
/// creation) measure alike.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PhaseStats {
    /// Failures by cause: the error condition the service answered with,
    /// or `timeout`, `closed`, `panic`.
    pub failures: BTreeMap<String, u64>,
    /// One example failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Wall-clock window (unix ms).
    pub started_unix_ms: u64,
    /// End of the window (unix ms).
    pub finished_unix_ms: u64,
    /// Length of the phase, s.
    pub duration_s: f64,
    /// Per success: request sent → done, re-sends included.
    pub latency: LatencySummary,
    /// Server CPU seconds during the phase (when its PID is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_s: Option<f64>,
    /// Load generator CPU seconds during the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_s: Option<f64>,
}

/// Entering the rooms (XEP-0045 §7.2, creation §10.1).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JoinResult {
    /// Sessions that tried to enter their room.
    pub attempted: u64,
    /// Entered: own presence (status 110) and the subject received (for
    /// the creator of a locked room: its instant-room form accepted).
    pub joined: u64,
    /// Did not enter.
    pub failed: u64,
    /// Joins that created their room (status 201).
    pub created: u64,
    /// Owner forms accepted (instant rooms, §10.1.2; with
    /// `muc#roomconfig_maxusers` for rooms larger than 200).
    pub configured: u64,
    /// Presences re-sent after `item-not-found` (a room still locked).
    pub retries: u64,
    /// Other occupants' presence received during the join phase and
    /// until they stopped arriving (none for 500 ms).
    pub presences_received: u64,
    /// Joins per second over the phase.
    pub joins_per_s: f64,
    /// Failures by cause (the error condition of the room's presence:
    /// `item-not-found`, `service-unavailable`, `conflict`…; `timeout`,
    /// `config` for the owner form refused, `closed`), the window, latency
    /// (presence sent → entering complete: the subject, or the creator's
    /// form result), CPU.
    #[serde(flatten)]
    pub phase: PhaseStats,
}

/// Creating the MUC Light rooms: one iq per room from its first member,
/// with the others as members.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CreationResult {
    /// Rooms whose creation was tried (those with a logged-in member).
    pub attempted: u64,
    /// Rooms created (the creation iq's result arrived).
    pub created: u64,
    /// Rooms not created.
    pub failed: u64,
    /// Members of the created rooms, creators included.
    pub members: u64,
    /// Creations re-sent after `resource-constraint`.
    pub retries: u64,
    /// Affiliation notifications the members of the created rooms should
    /// get (one each, the creator's included).
    pub notifications_expected: u64,
    /// Notifications received (groupchat from a room's bare JID with an
    /// empty body) until all arrived or none came for 500 ms.
    pub notifications_received: u64,
    /// Rooms created per second over the phase.
    pub rooms_per_s: f64,
    /// Members of created rooms per second over the phase.
    pub members_per_s: f64,
    /// Failures by cause (the creation iq's error condition: `conflict`,
    /// `not-allowed`, `bad-request`, `service-unavailable`,
    /// `remote-server-not-found`…; `timeout`, `closed`), the window,
    /// latency (creation iq sent → its result), CPU.
    #[serde(flatten)]
    pub phase: PhaseStats,
}

/// The server's memory in the `muc-light` scenario (`VmRSS`, KiB).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RoomMemory {
    /// The measured process.
    pub server_pid: u32,
    /// Before the first login.
    pub rss_before_kb: u64,
    /// Every session logged in (with presence), after `--settle-secs`.
    pub rss_sessions_kb: u64,
    /// The rooms created, after `--settle-secs`.
    pub rss_rooms_kb: u64,
    /// (sessions − before) / sessions established.
    pub kb_per_session: f64,
    /// (rooms − sessions) / rooms created.
    pub kb_per_room: f64,
}

/// One step of the MUC ramp. Messages count where they were sent (the
/// send time travels in the body); `delivered`/`arrived` are copies.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MucStepResult {
    /// Target rate, messages sent per second over all rooms.
    pub target_rate: f64,
    /// Messages sent.
    pub sent: u64,
    /// sent / step length.
    pub sent_per_s: f64,
    /// Copies the messages sent should produce: the occupants of each
    /// message's room (sender included).
    pub expected_copies: u64,
    /// Of those, copies that arrived (by the end of the drain).
    pub delivered_copies: u64,
    /// delivered_copies / step length.
    pub delivered_per_s: f64,
    /// Copies that arrived during this step, whenever sent.
    pub arrived_copies: u64,
    /// arrived_copies / step length.
    pub arrived_per_s: f64,
    /// delivered_copies / expected_copies.
    pub delivery_ratio: f64,
    /// Error stanzas received for messages of this step.
    pub errors: u64,
    /// Messages the tool could not queue (its outbox was full).
    pub client_dropped: u64,
    /// Send → arrival of every copy.
    pub latency: LatencySummary,
    /// Messages whose every expected copy arrived.
    pub messages_complete: u64,
    /// Per complete message: send → arrival of its LAST copy (the slowest
    /// occupant). Its p99 is the fan-out figure.
    pub last_copy_latency: LatencySummary,
    /// Whether this step kept up: delivery ratio ≥ the minimum, p99 of the
    /// copies ≤ the bound, the tool reached ≥ 90 % of the target rate.
    pub ok: bool,
    /// Server CPU use during the step, % of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_pct: Option<f64>,
    /// Load generator CPU use during the step, % of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu_pct: Option<f64>,
    /// Server CPU per copy that arrived during the step, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_copy: Option<f64>,
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

/// The `resume` scenario: full logins with stream management, unacked
/// messages, dropped connections, resumption (XEP-0198 §5).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ResumeResult {
    /// Messages each session received and left unacknowledged before its
    /// connection was dropped (`--unacked`).
    pub unacked_per_session: u64,
    /// Of the `unacked_per_session × sessions` messages, those that arrived.
    pub unacked_delivered: u64,
    /// The measured server process.
    pub server_pid: u32,
    /// VmRSS before the first login, KiB.
    pub rss_before_kb: u64,
    /// VmRSS with every session logged in (stream management on), KiB.
    pub rss_attached_kb: u64,
    /// VmRSS once every session holds its unacked messages, KiB.
    pub rss_filled_kb: u64,
    /// VmRSS after the connections were dropped (sessions detached), KiB.
    pub rss_detached_kb: u64,
    /// Sessions detached (connection dropped).
    pub detached: u64,
    /// (attached − before) / sessions, KiB.
    pub kb_per_attached_session: f64,
    /// (detached − before) / detached sessions, KiB: one detached session
    /// holding its unacked messages.
    pub kb_per_detached_session: f64,
    /// The resumption storm (`established` = resumed).
    pub resumes: ConnectResult,
    /// Resumed sessions whose `<resumed h/>` did not count every stanza the
    /// client sent before the drop.
    pub h_mismatch: u64,
    /// Resumptions per second ÷ logins per second (same concurrency).
    pub rate_ratio: f64,
    /// Server CPU per login ÷ server CPU per resumption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_ratio: Option<f64>,
}

/// The `archive` scenario (XEP-0313 queries).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ArchiveResult {
    /// Requested results per page.
    pub page_size: u32,
    /// Length of the measurement, s.
    pub duration_s: f64,
    /// Target total queries/s (0 = closed loop).
    pub target_rate: f64,
    /// Users that ran queries.
    pub users: u64,
    /// Archive fill before measuring (absent with `--fill 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill: Option<FillResult>,
    /// Id collection for `by-id`.
    pub warmup: WarmupResult,
    /// One entry per query kind, in `--queries` order.
    pub kinds: Vec<QueryKindResult>,
    /// Successful queries per second over all kinds.
    pub queries_per_s: f64,
}

/// Filling the archives with chat messages from partner accounts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FillResult {
    /// Messages per measured user.
    pub per_user: u64,
    /// Partner accounts that sent them.
    pub partners: u64,
    /// Messages sent.
    pub sent: u64,
    /// Messages the measured users received.
    pub delivered: u64,
    /// From the first send to the last delivery, s.
    pub duration_s: f64,
    /// delivered / duration.
    pub delivered_per_s: f64,
    /// Whether every message arrived before the no-progress timeout.
    pub complete: bool,
}

/// Warm-up: oldest/newest bounds and time-range probes per user.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WarmupResult {
    /// Distinct message ids collected over all users.
    pub ids: u64,
    /// Users without ids: empty archive or failed warm-up (no `by-id`
    /// queries for them).
    pub users_without_ids: u64,
    /// Warm-up queries that failed.
    pub errors: u64,
    /// One example failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Length of the warm-up, s.
    pub duration_s: f64,
}

/// Results of one query kind.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct QueryKindResult {
    /// `latest`, `by-id` or `with`.
    pub kind: String,
    /// Queries sent.
    pub queries: u64,
    /// Queries answered with a well-formed page.
    pub ok: u64,
    /// Failed queries by cause (`error` stanza, `timeout`, `count`,
    /// `closed`, `malformed`, `send`).
    pub errors: BTreeMap<String, u64>,
    /// One example failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Result messages received in good pages.
    pub results: u64,
    /// Good pages shorter than the page size without `complete='true'`
    /// (the server enforces a smaller maximum).
    pub capped: u64,
    /// Good queries per second.
    pub queries_per_s: f64,
    /// Send of the iq (or its scheduled time at `--rate`) to the `<fin/>`
    /// result, over good queries.
    pub latency: LatencySummary,
}

impl QueryKindResult {
    /// Failed queries.
    pub fn failed(&self) -> u64 {
        self.errors.values().sum()
    }
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

/// Instance cost per billion delivered messages.
pub fn cost_per_billion(hourly_price: f64, delivered_per_s: f64) -> Option<f64> {
    if delivered_per_s <= 0.0 {
        return None;
    }
    Some(hourly_price / (delivered_per_s * 3600.0) * 1e9)
}

impl ConnectResult {
    /// Recomputes duration and rate from the window.
    pub fn finalize(&mut self) {
        self.duration_s =
            self.finished_unix_ms.saturating_sub(self.started_unix_ms) as f64 / 1000.0;
        self.sessions_per_s = if self.duration_s > 0.0 {
            self.established as f64 / self.duration_s
        } else {
            0.0
        };
    }

    /// Merges worker results (counts add, window is the union, latency merges
    /// exactly).
    pub fn merge(parts: &[ConnectResult]) -> anyhow::Result<ConnectResult> {
        let mut out = ConnectResult {
            started_unix_ms: parts.iter().map(|p| p.started_unix_ms).min().unwrap_or(0),
            finished_unix_ms: parts.iter().map(|p| p.finished_unix_ms).max().unwrap_or(0),
            ..ConnectResult::default()
        };
        for p in parts {
            out.attempted += p.attempted;
            out.established += p.established;
            out.failed += p.failed;
            for (k, v) in &p.failures {
                *out.failures.entry(k.clone()).or_default() += v;
            }
            if out.first_error.is_none() {
                out.first_error.clone_from(&p.first_error);
            }
            out.client_cpu_s = sum_opt(out.client_cpu_s, p.client_cpu_s);
        }
        out.server_cpu_s = parts.iter().find_map(|p| p.server_cpu_s);
        out.setup_latency = LatencySummary::merge_all(parts.iter().map(|p| &p.setup_latency))?;
        out.finalize();
        Ok(out)
    }
}

impl RoomRampResult {
    /// Recomputes per-step rates, ratios, CPU per copy and `ok`, then the
    /// saturation point.
    pub fn finalize(&mut self) {
        let secs = self.step_secs.max(1e-9);
        for s in &mut self.steps {
            s.sent_per_s = s.sent as f64 / secs;
            s.delivered_per_s = s.delivered_copies as f64 / secs;
            s.arrived_per_s = s.arrived_copies as f64 / secs;
            s.delivery_ratio = if s.expected_copies > 0 {
                s.delivered_copies as f64 / s.expected_copies as f64
            } else {
                0.0
            };
            s.server_cpu_us_per_copy = match s.server_cpu_pct {
                Some(p) if s.arrived_copies > 0 => {
                    Some(p / 100.0 * secs / s.arrived_copies as f64 * 1e6)
                }
                _ => None,
            };
            s.ok = s.sent > 0
                && s.delivery_ratio >= self.min_delivery_ratio
                && s.latency.p99_ms <= self.p99_bound_ms
                && s.sent_per_s >= 0.9 * s.target_rate;
        }
        let points: Vec<RampPoint> = self
            .steps
            .iter()
            .map(|s| RampPoint {
                ok: s.ok,
                target_rate: s.target_rate,
                delivered_per_s: s.delivered_per_s,
            })
            .collect();
        self.saturation = saturation_of(&points, self.p99_bound_ms);
        if self.saturation.rate > 0.0 {
            self.saturation.note = format!(
                "{}; {:.0} delivered copies/s at {} msg/s sent",
                self.saturation.note, self.saturation.delivered_per_s, self.saturation.rate
            );
        }
    }

    /// With `--require-ratio`: fails unless that fraction of the copies
    /// expected over the ramp was delivered (nothing to check without a
    /// ramp).
    pub fn require(&self, ratio: f64) -> anyhow::Result<()> {
        if self.steps.is_empty() {
            return Ok(());
        }
        let expected: u64 = self.steps.iter().map(|s| s.expected_copies).sum();
        let delivered: u64 = self.steps.iter().map(|s| s.delivered_copies).sum();
        anyhow::ensure!(
            expected > 0 && delivered as f64 >= ratio * expected as f64,
            "only {delivered}/{expected} copies of room messages delivered"
        );
        Ok(())
    }
}

impl PhaseStats {
    /// Counts a failure by cause; the first failure's detail is kept as
    /// the example.
    pub fn fail(&mut self, cause: &str, detail: impl FnOnce() -> String) {
        *self.failures.entry(cause.to_owned()).or_default() += 1;
        if self.first_error.is_none() {
            self.first_error = Some(detail());
        }
    }

    /// With `--require-ratio`: fails unless `done` of `attempted` (what
    /// they are: `what`) reach `ratio`.
    pub fn require(&self, done: u64, attempted: u64, ratio: f64, what: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            attempted > 0 && done as f64 >= ratio * attempted as f64,
            "only {done}/{attempted} {what} ({:?})",
            self.first_error
        );
        Ok(())
    }

    /// Sets the phase's length from its window and returns `n` per second
    /// over it.
    pub fn per_s(&mut self, n: u64) -> f64 {
        self.duration_s =
            self.finished_unix_ms.saturating_sub(self.started_unix_ms) as f64 / 1000.0;
        if self.duration_s > 0.0 {
            n as f64 / self.duration_s
        } else {
            0.0
        }
    }
}

impl JoinResult {
    /// Recomputes duration and rate from the window.
    pub fn finalize(&mut self) {
        self.joins_per_s = self.phase.per_s(self.joined);
    }
}

impl CreationResult {
    /// Recomputes duration and rates from the window.
    pub fn finalize(&mut self) {
        self.rooms_per_s = self.phase.per_s(self.created);
        self.members_per_s = self.phase.per_s(self.members);
    }
}

impl O2oResult {
    /// Recomputes per-step rates, ratios and `ok`, then the saturation point.
    pub fn finalize(&mut self) {
        let secs = self.step_secs.max(1e-9);
        for s in &mut self.steps {
            s.sent_per_s = s.sent as f64 / secs;
            s.delivered_per_s = s.delivered as f64 / secs;
            s.arrived_per_s = s.arrived as f64 / secs;
            s.delivery_ratio = if s.sent > 0 {
                s.delivered as f64 / s.sent as f64
            } else {
                0.0
            };
            s.ok = s.sent > 0
                && s.delivery_ratio >= self.min_delivery_ratio
                && s.latency.p99_ms <= self.p99_bound_ms
                && s.sent_per_s >= 0.9 * s.target_rate;
        }
        self.saturation = saturation(&self.steps, self.p99_bound_ms);
    }

    /// Merges worker results step by step (all workers run the same ramp).
    pub fn merge(parts: &[O2oResult]) -> anyhow::Result<O2oResult> {
        let first = parts
            .first()
            .ok_or_else(|| anyhow::anyhow!("no o2o results to merge"))?;
        let n = parts.iter().map(|p| p.steps.len()).max().unwrap_or(0);
        let mut steps = Vec::with_capacity(n);
        for i in 0..n {
            let each: Vec<&StepResult> = parts.iter().filter_map(|p| p.steps.get(i)).collect();
            steps.push(StepResult {
                target_rate: each[0].target_rate,
                sent: each.iter().map(|s| s.sent).sum(),
                delivered: each.iter().map(|s| s.delivered).sum(),
                arrived: each.iter().map(|s| s.arrived).sum(),
                errors: each.iter().map(|s| s.errors).sum(),
                client_dropped: each.iter().map(|s| s.client_dropped).sum(),
                latency: LatencySummary::merge_all(each.iter().map(|s| &s.latency))?,
                // Every worker sees the same server; client CPU adds up.
                server_cpu_pct: each.iter().find_map(|s| s.server_cpu_pct),
                client_cpu_pct: each.iter().fold(None, |a, s| sum_opt(a, s.client_cpu_pct)),
                ..StepResult::default()
            });
        }
        let mut out = O2oResult {
            step_secs: first.step_secs,
            p99_bound_ms: first.p99_bound_ms,
            min_delivery_ratio: first.min_delivery_ratio,
            drain_secs: first.drain_secs,
            steps,
            saturation: Saturation::default(),
        };
        out.finalize();
        Ok(out)
    }
}

fn sum_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x + y),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The highest step that kept up, and whether a later one failed.
pub fn saturation(steps: &[StepResult], bound_ms: f64) -> Saturation {
    let points: Vec<RampPoint> = steps
        .iter()
        .map(|s| RampPoint {
            ok: s.ok,
            target_rate: s.target_rate,
            delivered_per_s: s.delivered_per_s,
        })
        .collect();
    saturation_of(&points, bound_ms)
}

/// What [`saturation_of`] needs of a step.
pub struct RampPoint {
    /// The step kept up.
    pub ok: bool,
    /// Its target rate.
    pub target_rate: f64,
    /// What it delivered per second.
    pub delivered_per_s: f64,
}

/// [`saturation`] over any kind of step.
pub fn saturation_of(steps: &[RampPoint], bound_ms: f64) -> Saturation {
    let best = steps.iter().rposition(|s| s.ok);
    match best {
        None => Saturation {
            reached: false,
            rate: 0.0,
            delivered_per_s: 0.0,
            note: format!(
                "no step kept up (delivery ratio or p99 ≤ {bound_ms} ms failed from the first step)"
            ),
        },
        Some(i) if i + 1 == steps.len() => Saturation {
            reached: false,
            rate: steps[i].target_rate,
            delivered_per_s: steps[i].delivered_per_s,
            note: format!(
                "every step up to {} msg/s kept up: saturation is above the ramp",
                steps[i].target_rate
            ),
        },
        Some(i) => Saturation {
            reached: true,
            rate: steps[i].target_rate,
            delivered_per_s: steps[i].delivered_per_s,
            note: format!(
                "kept up to {} msg/s; {} msg/s failed",
                steps[i].target_rate,
                steps[i + 1].target_rate
            ),
        },
    }
}

impl RunResult {
    /// Fills [`RunResult::cost`] from the saturation point.
    pub fn compute_cost(&mut self, hourly_price: Option<f64>) {
        let (Some(price), Some(o2o)) = (hourly_price, &self.o2o) else {
            return;
        };
        let d = o2o.saturation.delivered_per_s;
        self.cost = cost_per_billion(price, d).map(|c| CostResult {
            hourly_price: price,
            delivered_per_s: d,
            cost_per_billion: c,
        });
    }

    /// The human-readable summary table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let t = &self.target;
        let _ = writeln!(
            s,
            "\n{} {} against {} ({}, domain {}, {} + {}), {} users, {} process(es)",
            self.tool,
            self.scenario,
            if t.label.is_empty() {
                &t.address
            } else {
                &t.label
            },
            t.address,
            t.domain,
            t.tls,
            t.mechanism,
            self.users,
            self.workers
        );
        let c = &self.connect;
        let _ = writeln!(
            s,
            "  sessions   {:>8} established, {} failed of {} in {:.2} s  =>  {:.0} sessions/s",
            c.established, c.failed, c.attempted, c.duration_s, c.sessions_per_s
        );
        let _ = writeln!(
            s,
            "  setup      p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            c.setup_latency.p50_ms,
            c.setup_latency.p90_ms,
            c.setup_latency.p99_ms,
            c.setup_latency.max_ms
        );
        if let (Some(srv), Some(cli)) = (c.server_cpu_s, c.client_cpu_s) {
            let _ = writeln!(
                s,
                "  cpu        server {:.1} s ({:.2} ms/session), load generator {:.1} s",
                srv,
                srv * 1000.0 / c.established.max(1) as f64,
                cli
            );
        }
        if !c.failures.is_empty() {
            let f: Vec<String> = c.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  failures   {}", f.join(" "));
            if let Some(e) = &c.first_error {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
        if let Some(i) = &self.idle {
            let _ = writeln!(
                s,
                "  memory     pid {}: {} KiB -> {} KiB for {} sessions  =>  {:.1} KiB/session",
                i.server_pid, i.rss_before_kb, i.rss_after_kb, i.sessions, i.kb_per_session
            );
            if let (Some(a), Some(f)) = (i.anon_kb_per_session, i.file_kb_per_session) {
                let _ = writeln!(
                    s,
                    "             of which anonymous (heap) {a:.1} KiB/session, file-backed (mapped files, page cache) {f:.1} KiB/session"
                );
            }
        }
        if let Some(o) = &self.o2o {
            let _ = writeln!(
                s,
                "  {:>9} {:>9} {:>11} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8}  ok",
                "target/s",
                "sent/s",
                "delivered/s",
                "arrived/s",
                "ratio",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "max ms"
            );
            for st in &o.steps {
                let _ = writeln!(
                    s,
                    "  {:>9.0} {:>9.0} {:>11.0} {:>9.0} {:>7.4} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7} {:>7}  {}",
                    st.target_rate,
                    st.sent_per_s,
                    st.delivered_per_s,
                    st.arrived_per_s,
                    st.delivery_ratio,
                    st.latency.p50_ms,
                    st.latency.p90_ms,
                    st.latency.p99_ms,
                    st.latency.max_ms,
                    pct(st.server_cpu_pct),
                    pct(st.client_cpu_pct),
                    if st.ok { "yes" } else { "NO" }
                );
            }
            let _ = writeln!(
                s,
                "  saturation {:.0} msg/s delivered ({})",
                o.saturation.delivered_per_s, o.saturation.note
            );
        }
        if let Some(a) = &self.archive {
            archive_table(&mut s, a);
        }
        if let Some(m) = &self.sm {
            let _ = writeln!(
                s,
                "  sm         {} <a/> sent, {} <r/> sent, {} <a/> received",
                m.acks_sent, m.requests_sent, m.acks_received
            );
        }
        if let Some(r) = &self.resume {
            resume_table(&mut s, r, c);
        }
        if let Some(m) = &self.muc {
            muc_table(&mut s, m);
        }
        if let Some(m) = &self.muc_light {
            muc_light_table(&mut s, m);
        }
        if let Some(p) = &self.pep {
            pep_table(&mut s, p);
        }
        if let Some(u) = &self.upload {
            upload_table(&mut s, u);
        }
        if let Some(c) = &self.cost {
            let _ = writeln!(
                s,
                "  cost       {:.4} per billion delivered messages at {} per hour",
                c.cost_per_billion, c.hourly_price
            );
        }
        s
    }
}

fn muc_table(s: &mut String, m: &MucResult) {
    let _ = writeln!(
        s,
        "  rooms      {}, history maxstanzas={}",
        layout_line(&m.layout),
        m.history
    );
    let j = &m.join;
    let _ = writeln!(
        s,
        "  joins      {:>8} joined, {} failed of {} in {:.2} s  =>  {:.0} joins/s; {} rooms created (201), {} configured, {} re-sent after item-not-found",
        j.joined, j.failed, j.attempted, j.phase.duration_s, j.joins_per_s, j.created, j.configured, j.retries
    );
    phase_table(
        s,
        "join",
        &j.phase,
        j.joined,
        &format!(
            "presence sent -> subject; {} occupant presences received",
            j.presences_received
        ),
    );
    ramp_table(s, &m.ramp, "occupant");
}

fn muc_light_table(s: &mut String, m: &MucLightResult) {
    let _ = writeln!(
        s,
        "  rooms      MUC Light: {}, run id {:?}",
        layout_line(&m.layout),
        m.run_id
    );
    let c = &m.creation;
    let _ = writeln!(
        s,
        "  creation   {:>8} rooms created, {} failed of {} in {:.2} s  =>  {:.0} rooms/s, {:.0} members/s; {} members, {} re-sent after resource-constraint",
        c.created, c.failed, c.attempted, c.phase.duration_s, c.rooms_per_s, c.members_per_s, c.members, c.retries
    );
    phase_table(
        s,
        "create",
        &c.phase,
        c.created,
        &format!(
            "create iq sent -> result; {}/{} affiliation notifications received",
            c.notifications_received, c.notifications_expected
        ),
    );
    if let Some(r) = &m.memory {
        let _ = writeln!(
            s,
            "  memory     pid {}: {} KiB before, {} KiB logged in, {} KiB with the rooms  =>  {:.1} KiB/session, {:.1} KiB/room",
            r.server_pid, r.rss_before_kb, r.rss_sessions_kb, r.rss_rooms_kb, r.kb_per_session, r.kb_per_room
        );
    }
    ramp_table(s, &m.ramp, "member");
}

/// `N rooms of S at SERVICE (K senders: …)`.
fn layout_line(l: &RoomLayout) -> String {
    format!(
        "{} rooms of {} at {} ({} senders: {})",
        l.rooms,
        l.room_size,
        l.service,
        l.senders,
        if l.senders_per_room == 0 {
            "every member".to_string()
        } else {
            format!("{} per room", l.senders_per_room)
        }
    )
}

/// Latency, CPU and failures of a room setup phase called `what`, whose
/// `done` successes took `note`.
fn phase_table(s: &mut String, what: &str, p: &PhaseStats, done: u64, note: &str) {
    let l = &p.latency;
    let _ = writeln!(
        s,
        "  {what:<10} p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms ({note})",
        l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
    );
    if let (Some(srv), Some(cli)) = (p.server_cpu_s, p.client_cpu_s) {
        let _ = writeln!(
            s,
            "  {:<10} server {srv:.1} s ({:.2} ms/{what}), load generator {cli:.1} s",
            format!("{what} cpu"),
            srv * 1000.0 / done.max(1) as f64,
        );
    }
    if !p.failures.is_empty() {
        let f: Vec<String> = p.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  {:<10} {}", format!("{what} fails"), f.join(" "));
        if let Some(e) = &p.first_error {
            let _ = writeln!(s, "  e.g.       {e}");
        }
    }
}

/// The ramp of a group chat scenario; `member` names who gets a copy.
fn ramp_table(s: &mut String, m: &RoomRampResult, member: &str) {
    if !m.errors_by_condition.is_empty() {
        let f: Vec<String> = m
            .errors_by_condition
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(s, "  errors     from the service: {}", f.join(" "));
    }
    if m.steps.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "  copies/s: delivered copies/s; per copy: latency of every {member}'s copy; last: per message, until its LAST {member} got it"
    );
    let _ = writeln!(
        s,
        "  {:>8} {:>8} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:>9} {:>6} {:>6} {:>7}  ok",
        "target/s",
        "sent/s",
        "copies/s",
        "arrived/s",
        "ratio",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "last p50",
        "last p99",
        "server",
        "tool",
        "µs/copy"
    );
    for st in &m.steps {
        let _ = writeln!(
            s,
            "  {:>8.0} {:>8.0} {:>9.0} {:>9.0} {:>7.4} {:>7.1} {:>7.1} {:>7.1} {:>8.1} {:>9.1} {:>9.1} {:>6} {:>6} {:>7}  {}",
            st.target_rate,
            st.sent_per_s,
            st.delivered_per_s,
            st.arrived_per_s,
            st.delivery_ratio,
            st.latency.p50_ms,
            st.latency.p90_ms,
            st.latency.p99_ms,
            st.latency.max_ms,
            st.last_copy_latency.p50_ms,
            st.last_copy_latency.p99_ms,
            pct(st.server_cpu_pct),
            pct(st.client_cpu_pct),
            st.server_cpu_us_per_copy
                .map(|u| format!("{u:.2}"))
                .unwrap_or_else(|| "-".into()),
            if st.ok { "yes" } else { "NO" }
        );
    }
    let errors: u64 = m.steps.iter().map(|s| s.errors).sum();
    let dropped: u64 = m.steps.iter().map(|s| s.client_dropped).sum();
    if errors + dropped + m.unexpected_copies > 0 {
        let _ = writeln!(
            s,
            "  {errors} error stanzas, {dropped} messages the tool could not queue, {} unexpected copies",
            m.unexpected_copies
        );
    }
    let _ = writeln!(
        s,
        "  saturation {:.0} delivered copies/s ({})",
        m.saturation.delivered_per_s, m.saturation.note
    );
}

fn pep_table(s: &mut String, p: &PepResult) {
    let _ = writeln!(
        s,
        "  pep        {} contacts per user ({} groups), {} node(s): {}; caps ver {}",
        p.contacts,
        p.groups,
        p.nodes.len(),
        if p.nodes.is_empty() {
            "none".to_string()
        } else {
            p.nodes.join(", ")
        },
        p.caps_ver
    );
    if let Some(x) = &p.setup {
        let _ = writeln!(
            s,
            "  prepared   {:.1} s (setup over XMPP): {} logins in {:.2} s; {}/{} contacts mutually subscribed ({} already) after {:.2} s, {} subscribe sent, {} pairs reset, {} stale items removed; {}/{} items published after {:.2} s ({} retries), {} stale nodes deleted",
            x.total_s,
            x.logins.established,
            x.logins.duration_s,
            x.contacts_both,
            x.contacts_expected,
            x.contacts_already,
            x.subscribe_s,
            x.subscribes_sent,
            x.pairs_reset,
            x.stale_items_removed,
            x.published,
            x.publish_expected,
            x.publish_s,
            x.publish_retries,
            x.stale_nodes_deleted
        );
        if !x.failures.is_empty() {
            let f: Vec<String> = x.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  prep fails {}", f.join(" "));
            if let Some(e) = &x.first_error {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
    }
    let _ = writeln!(
        s,
        "  storm      {} logins {}, caps {}; a window closes {} ms after the last expected notification, or {:.0} s after the presence; {:.1} s to the last window  =>  {:.0} notifications/s",
        p.logins,
        if p.target_rate > 0.0 {
            format!("at {} logins/s", p.target_rate)
        } else {
            "all at once".to_string()
        },
        if p.caps_warmed_up {
            format!(
                "known to the server (warm-up: {} queries)",
                p.caps_warmup_queries
            )
        } else {
            "new to the server".to_string()
        },
        p.quiet_ms,
        p.window_secs,
        p.duration_s,
        p.notifications_per_s
    );
    let _ = writeln!(
        s,
        "  notified   {:.1} per login ({:.1} expected): {}/{} expected received, {} missing ({} of publishers online first, {} of later ones), {} duplicates, {} unexpected, {} after the window; {}/{} logins complete{}",
        p.received_per_login,
        p.expected_per_login,
        p.received_expected,
        p.expected,
        p.missing,
        p.missing_online_first,
        p.missing_later,
        p.duplicates,
        p.unexpected,
        p.after_window,
        p.complete_logins,
        p.logins,
        if p.closed_in_window > 0 {
            format!(", {} closed by the server", p.closed_in_window)
        } else {
            String::new()
        }
    );
    let (l, a) = (&p.latency, &p.after_presence_latency);
    let _ = writeln!(
        s,
        "  last       p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms (connect -> last notification); from the presence: p50 {:.1} ms  p99 {:.1} ms",
        l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms, a.p50_ms, a.p99_ms
    );
    let _ = writeln!(
        s,
        "  traffic    {:.1} KiB received per login after binding ({:.1} presences); {} caps queries answered{}",
        p.bytes_per_login / 1024.0,
        p.presences_per_login,
        p.caps_queries,
        p.server_cpu_ms_per_login
            .map(|c| format!("; server CPU {c:.2} ms/login"))
            .unwrap_or_default()
    );
    if let Some(m) = &p.memory {
        let _ = writeln!(
            s,
            "  memory     pid {}: {} KiB -> {} KiB for {} sessions  =>  {:.1} KiB/session",
            m.server_pid, m.rss_before_kb, m.rss_after_kb, p.logins, m.kb_per_session
        );
    }
    if let Some(f) = &p.fanout {
        let _ = writeln!(
            s,
            "  fan-out    {}/{} publications to {} (one every {} ms, up to {} receivers each, {} errors): {}/{} notifications delivered, {} duplicates, {}/{} publications complete",
            f.sent,
            f.publications,
            f.node,
            f.interval_ms,
            f.max_receivers,
            f.errors,
            f.delivered,
            f.expected,
            f.duplicates,
            f.complete,
            f.sent
        );
        let (l, z) = (&f.latency, &f.last_latency);
        let _ = writeln!(
            s,
            "  fan-out    to each contact p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms; to the last contact p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            l.p50_ms, l.p99_ms, l.max_ms, z.p50_ms, z.p99_ms, z.max_ms
        );
    }
}

fn resume_table(s: &mut String, r: &ResumeResult, login: &ConnectResult) {
    let per = |cpu: Option<f64>, n: u64| cpu.map(|c| c * 1000.0 / n.max(1) as f64);
    let x = &r.resumes;
    let _ = writeln!(
        s,
        "  resumed    {:>8} resumed, {} failed of {} in {:.2} s  =>  {:.0} resumes/s ({:.2}x the login rate)",
        x.established, x.failed, x.attempted, x.duration_s, x.sessions_per_s, r.rate_ratio
    );
    let _ = writeln!(
        s,
        "  resume     p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        x.setup_latency.p50_ms,
        x.setup_latency.p90_ms,
        x.setup_latency.p99_ms,
        x.setup_latency.max_ms
    );
    if let (Some(l), Some(m)) = (
        per(login.server_cpu_s, login.established),
        per(x.server_cpu_s, x.established),
    ) {
        let _ = writeln!(
            s,
            "  cpu        server {l:.2} ms/login, {m:.2} ms/resume ({:.2}x); load generator {:.1} s, {:.1} s",
            r.server_cpu_ratio.unwrap_or(0.0),
            login.client_cpu_s.unwrap_or(0.0),
            x.client_cpu_s.unwrap_or(0.0)
        );
    }
    if !x.failures.is_empty() {
        let f: Vec<String> = x.failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  failures   {}", f.join(" "));
        if let Some(e) = &x.first_error {
            let _ = writeln!(s, "  e.g.       {e}");
        }
    }
    let _ = writeln!(
        s,
        "  memory     pid {}: {} KiB before, {} attached, {} with {} unacked each ({} delivered), {} detached",
        r.server_pid,
        r.rss_before_kb,
        r.rss_attached_kb,
        r.rss_filled_kb,
        r.unacked_per_session,
        r.unacked_delivered,
        r.rss_detached_kb
    );
    let _ = writeln!(
        s,
        "             => {:.1} KiB/attached session, {:.1} KiB/detached session ({} detached); h mismatches: {}",
        r.kb_per_attached_session, r.kb_per_detached_session, r.detached, r.h_mismatch
    );
}

fn archive_table(s: &mut String, a: &ArchiveResult) {
    if let Some(f) = &a.fill {
        let _ = writeln!(
            s,
            "  fill       {} of {} messages delivered ({} per user from {} partners) in {:.1} s  =>  {:.0} msg/s{}",
            f.delivered,
            f.sent,
            f.per_user,
            f.partners,
            f.duration_s,
            f.delivered_per_s,
            if f.complete { "" } else { "  INCOMPLETE" }
        );
    }
    let w = &a.warmup;
    let _ = writeln!(
        s,
        "  warm-up    {} message ids collected in {:.1} s; {} user(s) without ids (empty archive or failed warm-up); {} failed queries",
        w.ids, w.duration_s, w.users_without_ids, w.errors
    );
    if let Some(e) = &w.first_error {
        let _ = writeln!(s, "  e.g.       {e}");
    }
    let _ = writeln!(
        s,
        "  {} users, page size {}, {:.0} s, {}",
        a.users,
        a.page_size,
        a.duration_s,
        if a.target_rate > 0.0 {
            format!("target {} queries/s", a.target_rate)
        } else {
            "closed loop".to_string()
        }
    );
    let _ = writeln!(
        s,
        "  {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7}",
        "query",
        "queries",
        "errors",
        "q/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "results",
        "capped"
    );
    for k in &a.kinds {
        let _ = writeln!(
            s,
            "  {:>8} {:>9} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9} {:>7}",
            k.kind,
            k.queries,
            k.failed(),
            k.queries_per_s,
            k.latency.p50_ms,
            k.latency.p90_ms,
            k.latency.p99_ms,
            k.latency.max_ms,
            k.results,
            k.capped
        );
    }
    for k in &a.kinds {
        if !k.errors.is_empty() {
            let f: Vec<String> = k.errors.iter().map(|(c, n)| format!("{c}={n}")).collect();
            let _ = writeln!(s, "  {} errors: {}", k.kind, f.join(" "));
            if let Some(e) = &k.first_error {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
    }
    let _ = writeln!(s, "  total      {:.1} good queries/s", a.queries_per_s);
}

/// `n` bytes as B, KiB, MiB or GiB.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn upload_table(s: &mut String, u: &UploadResult) {
    let _ = writeln!(
        s,
        "  upload     service {}{}, max-file-size {}, {} URLs, content type {}",
        u.service,
        if u.discovered { " (discovered)" } else { "" },
        u.max_file_size
            .map(human_bytes)
            .unwrap_or_else(|| "not announced".into()),
        if u.scheme.is_empty() { "no" } else { &u.scheme },
        u.content_type
    );
    if u.phases.is_empty() {
        let _ = writeln!(s, "  (no phase ran: --big-mb 0 and --parallel 0)");
        return;
    }
    let _ = writeln!(
        s,
        "  {:<9} {:<4} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}  server RSS MiB before/max/after (max-before)",
        "phase", "dir", "ok", "MiB/s", "time s", "p50 ms", "p90 ms", "p99 ms", "max ms", "cpu s"
    );
    let mib = |kb: u64| kb as f64 / 1024.0;
    for p in &u.phases {
        for (dir, t) in [("up", &p.upload), ("down", &p.download)] {
            let mem = t
                .memory
                .as_ref()
                .map(|m| {
                    format!(
                        "{:.1}/{:.1}/{:.1} (+{:.1}, {} samples)",
                        mib(m.before_kb),
                        mib(m.max_kb),
                        mib(m.after_kb),
                        mib(m.growth_kb),
                        m.samples
                    )
                })
                .unwrap_or_else(|| "-".into());
            let l = &t.latency;
            let _ = writeln!(
                s,
                "  {:<9} {:<4} {:>7} {:>9.1} {:>8.2} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7}  {}",
                p.name,
                dir,
                format!("{}/{}", t.ok, t.files),
                t.mib_per_s,
                t.duration_s,
                l.p50_ms,
                l.p90_ms,
                l.p99_ms,
                l.max_ms,
                t.server_cpu_s
                    .map(|c| format!("{c:.2}"))
                    .unwrap_or_else(|| "-".into()),
                mem
            );
        }
        let sl = &p.slots;
        let _ = writeln!(
            s,
            "  {:<9} {} file(s) of {}: {}/{} slots (p50 {:.1} ms, p99 {:.1} ms), {}/{} verified byte for byte, {:.2} s in all",
            p.name,
            p.files,
            human_bytes(p.file_bytes),
            sl.granted,
            sl.requested,
            sl.latency.p50_ms,
            sl.latency.p99_ms,
            p.verified,
            p.files,
            p.total_s
        );
        for (what, failures, first) in [
            ("slots", &sl.failures, &sl.first_error),
            ("up", &p.upload.failures, &p.upload.first_error),
            ("down", &p.download.failures, &p.download.first_error),
        ] {
            if failures.is_empty() {
                continue;
            }
            let f: Vec<String> = failures.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  {:<9} {what} failed: {}", p.name, f.join(" "));
            if let Some(e) = first {
                let _ = writeln!(s, "  e.g.       {e}");
            }
        }
    }
}

fn pct(v: Option<f64>) -> String {
    v.map(|p| format!("{p:.0}%")).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hist::Latency;

    fn lat(values: &[u64]) -> LatencySummary {
        let mut h = Latency::new();
        for v in values {
            h.record_us(*v);
        }
        h.summary()
    }

    fn step(rate: f64, sent: u64, delivered: u64, lat_us: u64) -> StepResult {
        StepResult {
            target_rate: rate,
            sent,
            delivered,
            latency: lat(&vec![lat_us; delivered as usize]),
            ..StepResult::default()
        }
    }

    fn o2o(steps: Vec<StepResult>) -> O2oResult {
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
    fn saturation_is_the_last_step_that_kept_up() {
        let o = o2o(vec![
            step(100.0, 1000, 1000, 2_000),
            step(200.0, 2000, 2000, 5_000),
            step(400.0, 4000, 3000, 5_000),   // ratio too low
            step(800.0, 8000, 8000, 500_000), // p99 too high
        ]);
        assert!(o.steps[0].ok && o.steps[1].ok && !o.steps[2].ok && !o.steps[3].ok);
        assert!(o.saturation.reached);
        assert_eq!(o.saturation.rate, 200.0);
        assert_eq!(o.saturation.delivered_per_s, 200.0);
    }

    #[test]
    fn client_that_cannot_reach_the_rate_does_not_count() {
        let o = o2o(vec![
            step(100.0, 1000, 1000, 1_000),
            step(1000.0, 5000, 5000, 1_000),
        ]);
        assert!(!o.steps[1].ok);
        assert_eq!(o.saturation.rate, 100.0);
    }

    #[test]
    fn ramp_without_failure_is_not_saturated() {
        let o = o2o(vec![step(100.0, 1000, 1000, 1_000)]);
        assert!(!o.saturation.reached);
        assert_eq!(o.saturation.rate, 100.0);
    }

    #[test]
    fn merging_worker_steps_adds_counts_and_histograms() {
        let a = o2o(vec![
            step(100.0, 500, 500, 1_000),
            step(200.0, 1000, 990, 1_000),
        ]);
        let b = o2o(vec![
            step(100.0, 500, 500, 3_000),
            step(200.0, 1000, 1000, 200_000),
        ]);
        let m = O2oResult::merge(&[a, b]).unwrap();
        assert_eq!(m.steps[0].sent, 1000);
        assert_eq!(m.steps[0].delivered, 1000);
        assert_eq!(m.steps[0].latency.count, 1000);
        assert!((m.steps[0].latency.p50_ms - 1.0).abs() < 0.01);
        assert!((m.steps[0].latency.p90_ms - 3.0).abs() < 0.01);
        assert_eq!(m.steps[1].delivered, 1990);
        // Half of step 2's deliveries are slow: merged p99 must see it.
        assert!(m.steps[1].latency.p99_ms > 100.0);
        assert!(!m.steps[1].ok);
        assert_eq!(m.saturation.rate, 100.0);
    }

    #[test]
    fn arrivals_per_step_are_summed_rated_and_optional_in_json() {
        // Past saturation a step's own messages arrive late (delivered/s
        // drops) while the server keeps delivering (arrived/s holds).
        let mut a = step(200.0, 2000, 600, 1_000);
        a.arrived = 1500;
        let mut b = step(200.0, 2000, 700, 1_000);
        b.arrived = 1400;
        let m = O2oResult::merge(&[o2o(vec![a]), o2o(vec![b])]).unwrap();
        assert_eq!(m.steps[0].arrived, 2900);
        assert_eq!(m.steps[0].arrived_per_s, 290.0);
        assert_eq!(m.steps[0].delivered_per_s, 130.0);
        // A result written before the field existed still reads.
        let mut v = serde_json::to_value(&m.steps[0]).unwrap();
        v.as_object_mut().unwrap().remove("arrived");
        v.as_object_mut().unwrap().remove("arrived_per_s");
        let old: StepResult = serde_json::from_value(v).unwrap();
        assert_eq!(old.arrived, 0);
    }

    #[test]
    fn connect_merge_uses_the_union_window() {
        let a = ConnectResult {
            attempted: 10,
            established: 9,
            failed: 1,
            failures: [("auth".to_string(), 1)].into(),
            started_unix_ms: 1_000,
            finished_unix_ms: 3_000,
            setup_latency: lat(&[1000; 9]),
            ..ConnectResult::default()
        };
        let b = ConnectResult {
            attempted: 10,
            established: 10,
            started_unix_ms: 1_500,
            finished_unix_ms: 5_000,
            setup_latency: lat(&[2000; 10]),
            ..ConnectResult::default()
        };
        let m = ConnectResult::merge(&[a, b]).unwrap();
        assert_eq!(m.established, 19);
        assert_eq!(m.failures["auth"], 1);
        assert_eq!(m.duration_s, 4.0);
        assert_eq!(m.sessions_per_s, 19.0 / 4.0);
        assert_eq!(m.setup_latency.count, 19);
    }

    #[test]
    fn cost_metric() {
        // 1 $/h at 10,000 msg/s: 36 M msgs per $ → 27.78 $ per billion.
        let c = cost_per_billion(1.0, 10_000.0).unwrap();
        assert!((c - 27.777_777).abs() < 1e-3);
        assert_eq!(cost_per_billion(1.0, 0.0), None);
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

    fn room_ramp() -> RoomRampResult {
        let mut r = RoomRampResult {
            step_secs: 10.0,
            p99_bound_ms: 100.0,
            min_delivery_ratio: 0.99,
            drain_secs: 1.0,
            steps: vec![
                MucStepResult {
                    target_rate: 100.0,
                    sent: 1000,
                    expected_copies: 5000,
                    delivered_copies: 5000,
                    arrived_copies: 5000,
                    latency: lat(&[2_000; 50]),
                    ..MucStepResult::default()
                },
                MucStepResult {
                    target_rate: 200.0,
                    sent: 2000,
                    expected_copies: 10_000,
                    delivered_copies: 8_000,
                    errors: 3,
                    latency: lat(&[2_000; 50]),
                    ..MucStepResult::default()
                },
            ],
            errors_by_condition: [("resource-constraint".to_string(), 3)].into(),
            ..RoomRampResult::default()
        };
        r.finalize();
        r
    }

    #[test]
    fn room_sections_stay_flat_in_json_and_round_trip() {
        let mut join = JoinResult {
            attempted: 20,
            joined: 19,
            failed: 1,
            phase: PhaseStats {
                started_unix_ms: 1_000,
                finished_unix_ms: 3_000,
                latency: lat(&[5_000; 19]),
                server_cpu_s: Some(0.5),
                ..PhaseStats::default()
            },
            ..JoinResult::default()
        };
        join.phase
            .fail("conflict", || "user3 in bench1: conflict".into());
        join.phase.fail("conflict", || "not kept".into());
        join.finalize();
        assert_eq!(join.joins_per_s, 9.5);
        let muc = MucResult {
            layout: RoomLayout {
                service: "conference.localhost".into(),
                rooms: 4,
                room_size: 5,
                ..RoomLayout::default()
            },
            join,
            ramp: room_ramp(),
            ..MucResult::default()
        };
        let v = serde_json::to_value(&muc).unwrap();
        // What bench/compare.sh reads.
        assert_eq!(v["rooms"], 4);
        assert_eq!(v["room_size"], 5);
        assert_eq!(v["join"]["joins_per_s"], 9.5);
        assert_eq!(v["join"]["failures"]["conflict"], 2);
        assert_eq!(v["join"]["first_error"], "user3 in bench1: conflict");
        assert_eq!(v["join"]["server_cpu_s"], 0.5);
        assert_eq!(v["join"]["latency"]["count"], 19);
        assert_eq!(v["steps"][0]["ok"], true);
        assert_eq!(v["steps"][1]["ok"], false);
        assert_eq!(v["saturation"]["rate"], 100.0);
        let note = v["saturation"]["note"].as_str().unwrap();
        assert!(
            note.ends_with("500 delivered copies/s at 100 msg/s sent"),
            "{note}"
        );
        let back: MucResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, muc);
        assert!(muc.join.phase.require(19, 20, 0.9, "joins").is_ok());
        let e = muc.join.phase.require(19, 20, 0.99, "joins").unwrap_err();
        assert!(e.to_string().starts_with("only 19/20 joins"), "{e}");
        assert!(muc.ramp.require(0.85).is_ok());
        assert!(muc.ramp.require(0.9).is_err(), "13000 of 15000 copies");
        assert!(RoomRampResult::default().require(1.0).is_ok(), "no ramp");
    }

    #[test]
    fn muc_light_section_round_trips_and_is_tabulated() {
        let mut creation = CreationResult {
            attempted: 4,
            created: 3,
            failed: 1,
            members: 15,
            notifications_expected: 15,
            notifications_received: 15,
            phase: PhaseStats {
                started_unix_ms: 1_000,
                finished_unix_ms: 1_500,
                latency: lat(&[3_000; 3]),
                ..PhaseStats::default()
            },
            ..CreationResult::default()
        };
        creation.phase.fail("conflict", || {
            "user16 creating bench-x-4: conflict: ".into()
        });
        creation.finalize();
        assert_eq!((creation.rooms_per_s, creation.members_per_s), (6.0, 30.0));
        let r = RunResult {
            scenario: "muc-light".into(),
            users: 20,
            muc_light: Some(MucLightResult {
                protocol: "MUC Light (urn:xmpp:muclight:0)".into(),
                layout: RoomLayout {
                    service: "muclight.localhost".into(),
                    room_prefix: "bench".into(),
                    room_size: 5,
                    rooms: 4,
                    senders: 15,
                    ..RoomLayout::default()
                },
                run_id: "0badcafe".into(),
                creation,
                memory: Some(RoomMemory {
                    server_pid: 7,
                    rss_before_kb: 10_000,
                    rss_sessions_kb: 12_000,
                    rss_rooms_kb: 12_300,
                    kb_per_session: 100.0,
                    kb_per_room: 100.0,
                }),
                ramp: room_ramp(),
            }),
            ..RunResult::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        let m = &v["muc_light"];
        assert_eq!(m["protocol"], "MUC Light (urn:xmpp:muclight:0)");
        assert_eq!(m["service"], "muclight.localhost");
        assert_eq!(m["creation"]["created"], 3);
        assert_eq!(m["creation"]["failures"]["conflict"], 1);
        assert_eq!(m["memory"]["kb_per_room"], 100.0);
        assert_eq!(m["steps"][1]["errors"], 3);
        assert_eq!(m["errors_by_condition"]["resource-constraint"], 3);
        assert!(v.get("muc").is_none());
        let back: RunResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let t = r.table();
        for want in [
            "MUC Light: 4 rooms of 5 at muclight.localhost (15 senders: every member), run id \"0badcafe\"",
            "3 rooms created, 1 failed of 4 in 0.50 s  =>  6 rooms/s, 30 members/s",
            "15/15 affiliation notifications received",
            "create fails conflict=1",
            "100.0 KiB/session, 100.0 KiB/room",
            "errors     from the service: resource-constraint=3",
            "copies/s: delivered copies/s; per copy: latency of every member's copy",
            "saturation 500 delivered copies/s",
        ] {
            assert!(t.contains(want), "{want:?} not in {t}");
        }
    }

    #[test]
    fn pep_section_round_trips_and_is_tabulated() {
        let mut logins = ConnectResult {
            attempted: 20,
            established: 20,
            started_unix_ms: 1_000,
            finished_unix_ms: 1_400,
            ..ConnectResult::default()
        };
        logins.finalize();
        let r = RunResult {
            scenario: "pep".into(),
            users: 20,
            connect: logins.clone(),
            pep: Some(PepResult {
                contacts: 4,
                groups: 4,
                nodes: vec![
                    "urn:xmpp:avatar:metadata".into(),
                    "http://jabber.org/protocol/nick".into(),
                ],
                caps_ver: "abc=".into(),
                quiet_ms: 500,
                window_secs: 30.0,
                caps_warmed_up: true,
                caps_warmup_queries: 1,
                missing_online_first: 1,
                missing_later: 1,
                setup: Some(PepSetup {
                    logins,
                    contacts_expected: 80,
                    contacts_both: 79,
                    subscribes_sent: 40,
                    publish_expected: 40,
                    published: 40,
                    total_s: 1.5,
                    failures: [("subscribe-timeout".to_string(), 1)].into(),
                    first_error: Some("subscribe-timeout: user 3: 1 of 4".into()),
                    ..PepSetup::default()
                }),
                logins: 20,
                expected: 200,
                received: 201,
                received_expected: 198,
                missing: 2,
                duplicates: 3,
                after_window: 1,
                complete_logins: 18,
                expected_per_login: 10.0,
                received_per_login: 10.05,
                bytes_per_login: 4096.0,
                caps_queries: 1,
                latency: lat(&[40_000; 20]),
                duration_s: 2.0,
                notifications_per_s: 100.5,
                server_cpu_ms_per_login: Some(3.5),
                memory: Some(PepMemory {
                    server_pid: 9,
                    rss_before_kb: 1_000,
                    rss_after_kb: 2_000,
                    kb_per_session: 50.0,
                }),
                fanout: Some(PepFanout {
                    node: "urn:xmpp:avatar:metadata".into(),
                    publications: 5,
                    sent: 5,
                    interval_ms: 500,
                    max_receivers: 5,
                    expected: 25,
                    delivered: 24,
                    complete: 4,
                    latency: lat(&[2_000; 24]),
                    last_latency: lat(&[3_000; 4]),
                    ..PepFanout::default()
                }),
                ..PepResult::default()
            }),
            ..RunResult::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        let p = &v["pep"];
        assert_eq!(p["setup"]["contacts_both"], 79);
        assert_eq!(p["setup"]["failures"]["subscribe-timeout"], 1);
        assert_eq!(p["received_expected"], 198);
        assert_eq!(p["latency"]["count"], 20);
        assert_eq!(p["memory"]["kb_per_session"], 50.0);
        assert_eq!(p["fanout"]["last_latency"]["count"], 4);
        let back: RunResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let t = r.table();
        for want in [
            "4 contacts per user (4 groups), 2 node(s): urn:xmpp:avatar:metadata, http://jabber.org/protocol/nick; caps ver abc=",
            "79/80 contacts mutually subscribed",
            "40/40 items published",
            "prep fails subscribe-timeout=1",
            "20 logins all at once, caps known to the server (warm-up: 1 queries); a window closes 500 ms after the last expected notification, or 30 s after the presence",
            "10.1 per login (10.0 expected): 198/200 expected received, 2 missing (1 of publishers online first, 1 of later ones), 3 duplicates, 0 unexpected, 1 after the window; 18/20 logins complete",
            "p50 40.0 ms",
            "4.0 KiB received per login after binding",
            "server CPU 3.50 ms/login",
            "1000 KiB -> 2000 KiB for 20 sessions  =>  50.0 KiB/session",
            "5/5 publications to urn:xmpp:avatar:metadata (one every 500 ms, up to 5 receivers each, 0 errors): 24/25 notifications delivered, 0 duplicates, 4/5 publications complete",
            "to each contact p50 2.0 ms  p99 2.0 ms  max 2.0 ms; to the last contact p50 3.0 ms  p99 3.0 ms  max 3.0 ms",
        ] {
            assert!(t.contains(want), "{want:?} not in {t}");
        }
        assert!(serde_json::to_value(RunResult::default())
            .unwrap()
            .get("pep")
            .is_none());
    }

    #[test]
    fn upload_section_round_trips_and_is_tabulated() {
        let transfer = |ok: u64, files: u64| TransferStats {
            files,
            ok,
            bytes: ok * 1024,
            duration_s: 0.5,
            mib_per_s: 12.5,
            latency: lat(&[1_000, 2_000]),
            failures: if ok < files {
                [("http-413".to_string(), files - ok)].into()
            } else {
                BTreeMap::new()
            },
            first_error: (ok < files).then(|| "http-413: HTTP 413 Payload Too Large".into()),
            server_cpu_s: Some(0.25),
            client_cpu_s: Some(0.5),
            memory: Some(RssWindow {
                before_kb: 20_480,
                max_kb: 22_528,
                after_kb: 21_504,
                growth_kb: 2_048,
                samples: 11,
            }),
        };
        let r = RunResult {
            scenario: "upload".into(),
            upload: Some(UploadResult {
                service: "upload.localhost".into(),
                discovered: true,
                max_file_size: Some(100 << 20),
                content_type: "application/octet-stream".into(),
                scheme: "https".into(),
                server_pid: Some(42),
                sample_ms: 50,
                phases: vec![UploadPhase {
                    name: "parallel".into(),
                    files: 3,
                    file_bytes: 1024,
                    slots: SlotStats {
                        requested: 3,
                        granted: 3,
                        latency: lat(&[500]),
                        ..SlotStats::default()
                    },
                    upload: transfer(2, 3),
                    download: transfer(2, 2),
                    verified: 2,
                    total_s: 1.5,
                }],
            }),
            ..RunResult::default()
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RunResult>(&json).unwrap(), r);
        let t = r.table();
        assert!(
            t.contains("service upload.localhost (discovered), max-file-size 100 MiB, https URLs"),
            "{t}"
        );
        assert!(t.contains("20.0/22.0/21.0 (+2.0, 11 samples)"), "{t}");
        assert!(t.contains("3 file(s) of 1 KiB: 3/3 slots"), "{t}");
        assert!(t.contains("2/3 verified byte for byte"), "{t}");
        assert!(t.contains("up failed: http-413=1"), "{t}");
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(100 << 20), "100 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
    }

    #[test]
    fn archive_section_round_trips_and_is_tabulated() {
        let r = RunResult {
            scenario: "archive".into(),
            archive: Some(ArchiveResult {
                page_size: 50,
                duration_s: 10.0,
                users: 2,
                fill: Some(FillResult {
                    per_user: 100,
                    partners: 2,
                    sent: 200,
                    delivered: 150,
                    duration_s: 2.0,
                    delivered_per_s: 75.0,
                    complete: false,
                }),
                kinds: vec![QueryKindResult {
                    kind: "by-id".into(),
                    queries: 12,
                    ok: 10,
                    errors: [("timeout".to_string(), 2)].into(),
                    first_error: Some("timeout: no <fin/> in time".into()),
                    results: 500,
                    queries_per_s: 1.0,
                    latency: lat(&[4_000; 10]),
                    ..QueryKindResult::default()
                }],
                queries_per_s: 1.0,
                ..ArchiveResult::default()
            }),
            ..RunResult::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["archive"]["kinds"][0]["latency"]["count"], 10);
        assert_eq!(v["archive"]["fill"]["complete"], false);
        let back: RunResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.archive.as_ref().unwrap().kinds[0].failed(), 2);
        let t = r.table();
        assert!(t.contains("150 of 200 messages delivered"), "{t}");
        assert!(t.contains("INCOMPLETE"), "{t}");
        assert!(t.contains("by-id errors: timeout=2"), "{t}");
        let row = t
            .lines()
            .find(|l| l.trim_start().starts_with("by-id "))
            .unwrap();
        assert!(row.contains("     4.0"), "p50 4 ms in {row}");
        // Other scenarios do not carry the section.
        let o = serde_json::to_value(RunResult::default()).unwrap();
        assert!(o.get("archive").is_none());
    }
}
