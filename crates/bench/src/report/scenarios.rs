//! The JSON shape of each scenario's own section: `upload`, `pep`, the
//! group chat scenarios (`muc`, `muc-light`), `resume`, `archive`.

use super::{ConnectResult, Saturation};
use crate::hist::LatencySummary;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
