//! Command-line options.

use crate::client::{Carrier, Mech, TlsMode};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::IpAddr;
use std::path::PathBuf;

/// Load generator for XMPP servers.
#[derive(Parser, Debug)]
#[command(name = "starling-bench", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Scenarios and tools.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Connection storm: sessions established per second, failures by cause.
    Connect(ScenarioArgs),
    /// Hold N sessions with initial presence; server KB per session.
    Idle(ScenarioArgs),
    /// One-to-one chat at a ramp of total rates; saturation point.
    O2o(ScenarioArgs),
    /// Multi-user chat (XEP-0045): users enter rooms of `--room-size`
    /// (the join storm: joins/s, join latency, failures by cause), then a
    /// ramp of groupchat messages (`--rates` = messages sent per second);
    /// every occupant's copy is counted and timed, and per message the
    /// time until its last occupant got it. Works against any XEP-0045
    /// service.
    Muc(MucArgs),
    /// MUC Light (MongooseIM's `urn:xmpp:muclight:0`, no presence in
    /// rooms): the first user of each `--room-size` group creates its room
    /// with the others as members in one iq (rooms/s, creation latency,
    /// failures by cause), then a ramp of groupchat messages (`--rates` =
    /// messages sent per second), each delivered to every member's bare
    /// JID: delivered copies/s, the latency of every copy and per message
    /// of its last one, errors by condition; server memory per session and
    /// per room when the server's PID is known. ejabberd and Prosody do
    /// not implement MUC Light.
    MucLight(MucLightArgs),
    /// Message Archive Management (XEP-0313) query latency: each user runs
    /// `latest`, `by-id` and/or `with` page queries in a closed loop (or at
    /// `--rate`) for `--duration-secs`; optionally fills the archives first
    /// (`--fill`). Works against any server with `urn:xmpp:mam:2`.
    #[command(mut_arg("users", |a| a.default_value("10")))]
    Archive(ArchiveArgs),
    /// XEP-0198 resumption vs full login: log in with stream management,
    /// optionally leave `--unacked` messages unacknowledged, drop every
    /// connection (sessions detached: server KiB per detached session),
    /// resume every session; resumes/s vs logins/s and server CPU of each.
    Resume(ResumeArgs),
    /// Personal eventing (XEP-0163) at login: the cost of the last items
    /// a user gets from its contacts when it comes online. Setup, over
    /// XMPP only: users in groups of `--contacts` + 1 consecutive users,
    /// every member mutually subscribed with the others (subscribe and
    /// subscribed both ways, until the roster pushes say `both`), each
    /// publishing one item to `--nodes` PEP nodes (avatar metadata, nick,
    /// OMEMO device lists with access model open…). Measured: a login
    /// storm at `--rate` logins/s, each with available presence carrying
    /// XEP-0115 caps whose features include every node's `+notify` (the
    /// server's disco#info query answered); each login counts the
    /// notifications it gets until `--quiet-ms` pass without one
    /// (expected: one per node of every group member, its own included):
    /// logins/s, latency connect → last notification, received vs
    /// expected, duplicates, bytes and server CPU per login, server memory
    /// per session. Works against any server with PEP and +notify
    /// (Starling, ejabberd, Prosody).
    Pep(PepArgs),
    /// Create N accounts.
    Provision(ProvisionArgs),
}

/// Rooms of the group chat scenarios (`muc`, `muc-light`).
#[derive(Args, Debug, Clone)]
pub struct RoomArgs {
    /// Members per room: consecutive users (user `first-user + i` is in
    /// room `i / room-size + 1`; the last room may be smaller).
    #[arg(long, default_value_t = 5)]
    pub room_size: u64,
    /// The service's domain (default: `conference.<--domain>` for `muc`,
    /// `muclight.<--domain>` for `muc-light`).
    #[arg(long)]
    pub service: Option<String>,
    /// Room names start with this prefix (`muc`: `{prefix}{k}`;
    /// `muc-light`: `{prefix}-{run-id}-{k}`).
    #[arg(long, default_value = "bench")]
    pub room_prefix: String,
    /// Members of each room that send (its lowest-numbered members that
    /// entered or were made members); 0: every member.
    #[arg(long, default_value_t = 0)]
    pub senders_per_room: u64,
}

impl RoomArgs {
    /// `--service`, or `{subdomain}.{domain}`.
    pub fn service_or(&self, subdomain: &str, domain: &str) -> String {
        self.service
            .clone()
            .unwrap_or_else(|| format!("{subdomain}.{domain}"))
    }
}

/// Options of the `muc` scenario.
///
/// User `first-user + i` is member `i mod room-size` of room `i / room-size
/// + 1` (`{room-prefix}{k}@{service}`), nickname = its user name.
#[derive(Args, Debug, Clone)]
pub struct MucArgs {
    /// Connection, ramp and output options (as for `o2o`; `--rates` are
    /// messages sent per second over all rooms, each delivered to every
    /// occupant).
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Rooms and senders.
    #[command(flatten)]
    pub rooms: RoomArgs,
    /// `maxstanzas` of the history asked for on entering (XEP-0045
    /// §7.2.13).
    #[arg(long, default_value_t = 0)]
    pub history: u32,
    /// Give up entering after this many seconds (re-sends after
    /// `item-not-found` included).
    #[arg(long, default_value_t = 60.0)]
    pub join_timeout_secs: f64,
    /// Joins in flight at once (default: `--concurrency`).
    #[arg(long)]
    pub join_concurrency: Option<usize>,
    /// Only log in and enter the rooms (the join storm), no message ramp.
    #[arg(long)]
    pub join_only: bool,
}

impl MucArgs {
    /// The MUC service's domain.
    pub fn service(&self) -> String {
        self.rooms
            .service_or("conference", &self.scenario.conn.domain)
    }
}

/// Options of the `muc-light` scenario.
///
/// User `first-user + i` is a member of room `i / room-size + 1`
/// (`{room-prefix}-{run-id}-{k}@{service}`); the room's first logged-in
/// user creates it, owner, with the others as members.
#[derive(Args, Debug, Clone)]
pub struct MucLightArgs {
    /// Connection, ramp and output options (as for `muc`).
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Rooms and senders.
    #[command(flatten)]
    pub rooms: RoomArgs,
    /// Part of every room node (`{room-prefix}-{run-id}-{k}`), so that a
    /// rerun creates new rooms instead of meeting the last run's (a
    /// creation answered `conflict`). Default: random hex digits, new
    /// every run. Empty: `{room-prefix}{k}`.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Give up creating a room after this many seconds (re-sends after
    /// `resource-constraint` included).
    #[arg(long, default_value_t = 30.0)]
    pub create_timeout_secs: f64,
    /// Room creations in flight at once (default: `--concurrency`).
    #[arg(long)]
    pub create_concurrency: Option<usize>,
    /// Only log in and create the rooms, no message ramp.
    #[arg(long)]
    pub create_only: bool,
}

impl MucLightArgs {
    /// The MUC Light service's domain.
    pub fn service(&self) -> String {
        self.rooms
            .service_or("muclight", &self.scenario.conn.domain)
    }
}

/// Options of the `resume` scenario.
#[derive(Args, Debug, Clone)]
pub struct ResumeArgs {
    /// Connection and output options (as for the other scenarios;
    /// `--sm` is implied).
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Messages each session receives and leaves unacknowledged before
    /// its connection is dropped.
    #[arg(long, default_value_t = 0)]
    pub unacked: u64,
    /// Give up waiting for the unacked messages after this many seconds
    /// without one.
    #[arg(long, default_value_t = 30.0)]
    pub fill_timeout_secs: f64,
    /// Resume inline in SASL2 (XEP-0388 with XEP-0198 "Inline Stream
    /// Resumption"): `<resume/>` inside `<authenticate/>`, so a resumption
    /// is one SASL exchange with no stream restart and no extra round
    /// trip. Logins stay RFC 6120 SASL + bind.
    #[arg(long)]
    pub sasl2: bool,
    /// With `--sasl2`: logins ask for a FAST token (XEP-0484, SCRAM over
    /// SASL2 with `<request-token/>`, then RFC 6120 bind), and
    /// resumptions authenticate with it (HT-SHA-256-NONE, one step)
    /// instead of SCRAM.
    #[arg(long, requires = "sasl2")]
    pub fast: bool,
}

/// Options of the `pep` scenario.
///
/// User `first-user + i` is in group `i / (contacts + 1)`; the members of
/// a group are each other's contacts (the last group may be smaller).
#[derive(Args, Debug, Clone)]
pub struct PepArgs {
    /// Connection and output options (as for the other scenarios;
    /// `--concurrency` bounds the logins in flight, `--settle-secs` is
    /// waited before each memory reading).
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Contacts per user: groups of this many + 1 consecutive users,
    /// mutually subscribed to each other.
    #[arg(long, default_value_t = 9)]
    pub contacts: u64,
    /// PEP nodes each user publishes one item to, at most 8, in this
    /// order: urn:xmpp:avatar:metadata, http://jabber.org/protocol/nick,
    /// eu.siacs.conversations.axolotl.devicelist (access model open),
    /// urn:xmpp:omemo:2:devices (open), then mood, activity, tune and
    /// geoloc (http://jabber.org/protocol/…). 0: none (a baseline).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=8))]
    pub nodes: u64,
    /// Logins started per second in the storm (0: all at once; either way
    /// at most `--concurrency` logins in flight until bound).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// A login is over once this long passed without a notification (from
    /// its presence or its last notification), ms.
    #[arg(long, default_value_t = 2000)]
    pub quiet_ms: u64,
    /// Skip the setup: the accounts are subscribed and have published
    /// (an earlier run with the same --users, --contacts and --nodes).
    #[arg(long)]
    pub skip_setup: bool,
    /// Give up a user's setup (subscriptions, publications) after this
    /// many seconds.
    #[arg(long, default_value_t = 60.0)]
    pub setup_timeout_secs: f64,
}

/// Where to connect and as whom.
#[derive(Args, Debug, Clone)]
pub struct ConnArgs {
    /// Server host (IP address).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Server port.
    #[arg(long, default_value_t = 5222)]
    pub port: u16,
    /// More server ports on the same host, e.g. the other nodes of a
    /// cluster: user n connects to the (n mod (1 + count))-th of --port and
    /// these, so with random partners that share of messages crosses
    /// nodes (half with one extra port). Memory and CPU are read for the
    /// --port (or --server-pid) process only.
    #[arg(long, value_delimiter = ',', value_name = "PORT,…")]
    pub extra_ports: Vec<u16>,
    /// XMPP domain.
    #[arg(long, default_value = "localhost")]
    pub domain: String,
    /// Transport security.
    #[arg(long, value_enum, default_value_t = TlsMode::Starttls)]
    pub tls: TlsMode,
    /// How XML travels: an XML stream over TCP, RFC 7395 WebSocket or
    /// XEP-0206 BOSH (for both, `--port` is the server's HTTP listener,
    /// e.g. 5280, and `--tls` is plain for ws:/http: or direct for
    /// wss:/https:). A BOSH session uses two TCP connections.
    #[arg(long, value_enum, default_value_t = Carrier::Tcp)]
    pub transport: Carrier,
    /// BOSH: the `wait` to ask for, seconds (how long the server may hold
    /// the long-polling request; Starling grants at most 60).
    #[arg(long, default_value_t = 60)]
    pub bosh_wait: u64,
    /// Enable XEP-0198 stream management with resumption after binding,
    /// in every session: the client answers the server's `<r/>` with
    /// `<a h/>` and asks for acks itself every `--sm-ack-every` stanzas.
    #[arg(long)]
    pub sm: bool,
    /// With `--sm`: send `<r/>` after this many stanzas sent (0: never;
    /// the server still asks for acks and gets them).
    #[arg(long, default_value_t = 10)]
    pub sm_ack_every: u32,
    /// SASL mechanism.
    #[arg(long, value_enum, default_value_t = Mech::ScramSha256)]
    pub mechanism: Mech,
    // No literal placeholder in these two docs: clap's help turns it
    // into a line break.
    /// User name pattern: n in braces (as in the default) is replaced by
    /// the user number.
    #[arg(long, default_value = "user{n}")]
    pub user_pattern: String,
    /// Password pattern: n in braces (as for --user-pattern) is replaced
    /// by the user number.
    #[arg(long, default_value = "password")]
    pub password: String,
    /// Number of the first user.
    #[arg(long, default_value_t = 1)]
    pub first_user: u64,
    /// Number of users (sessions).
    #[arg(long, short = 'n', default_value_t = 100)]
    pub users: u64,
    /// Local source addresses, comma-separated (e.g. 127.0.0.1,127.0.0.2),
    /// used round-robin. Default: one loopback address per 25,000
    /// connections (127.0.0.1, 127.0.0.2, …), no explicit bind below that.
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<IpAddr>,
    /// Session setups in flight at once (per process).
    #[arg(long, default_value_t = 100)]
    pub concurrency: usize,
    /// Timeout of each setup step (connect, TLS, each SASL round…), seconds.
    #[arg(long, default_value_t = 30.0)]
    pub step_timeout: f64,
}

impl ScenarioArgs {
    /// Sessions one process holds before workers are used.
    pub fn sessions_per_process(&self) -> u64 {
        (self.max_per_process / self.conn.connections_per_session()).max(1)
    }
}

/// Options of a scenario run.
#[derive(Args, Debug, Clone)]
pub struct ScenarioArgs {
    /// Connection options.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Resource to bind (the `o2o` scenario addresses full JIDs with it).
    #[arg(long, default_value = "bench")]
    pub resource: String,
    /// A label for the server in reports (e.g. "starling 0.1.0").
    #[arg(long, default_value = "")]
    pub label: String,
    /// Print one JSON object (the whole result) on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also append the JSON result to this file.
    #[arg(long)]
    pub json_file: Option<PathBuf>,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
    /// Connections per process before worker processes are used (the
    /// per-process open-file limit here is 20,000). A BOSH session counts
    /// as two.
    #[arg(long, default_value_t = 19_000)]
    pub max_per_process: u64,
    /// Fail (exit 1) unless at least this fraction of sessions was
    /// established and, for `o2o`, of messages delivered over the whole
    /// run (for `muc`: of joins, and of the copies every occupant should
    /// get; for `muc-light`: of rooms created, and of the copies every
    /// member should get). 0 disables the check.
    #[arg(long, default_value_t = 0.0)]
    pub require_ratio: f64,

    /// `idle`, `resume`, `muc`, `muc-light`, `pep`: PID of the server, for
    /// its memory and CPU (default: whoever listens on --port).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// `idle`, `resume`, `muc-light`, `pep`: seconds to wait before each
    /// memory reading (after the last session; `muc-light`: also after the
    /// rooms; `pep`: also between the setup and the storm).
    #[arg(long, default_value_t = 5.0)]
    pub settle_secs: f64,
    /// `idle`, `connect`: seconds to hold the sessions after measuring.
    #[arg(long, default_value_t = 0.0)]
    pub hold_secs: f64,
    /// `connect`: send initial presence after binding (always on for idle and o2o).
    #[arg(long)]
    pub presence: bool,

    /// `o2o`, `muc`, `muc-light`: ramp of total rates in msg/s (sent;
    /// for rooms each is delivered to every member): list and/or
    /// FROM..TO/STEP.
    #[arg(long, default_value = "100,200,500,1000,2000,5000,10000")]
    pub rates: String,
    /// `o2o`, `muc`, `muc-light`: seconds per ramp step.
    #[arg(long, default_value_t = 10.0)]
    pub step_secs: f64,
    /// `o2o`, `muc`, `muc-light`: p99 latency bound (of every copy) for a
    /// step to keep up, ms.
    #[arg(long, default_value_t = 100.0)]
    pub p99_bound_ms: f64,
    /// `o2o`, `muc`, `muc-light`: delivery ratio (copies delivered ÷
    /// expected) for a step to keep up.
    #[arg(long, default_value_t = 0.99)]
    pub min_ratio: f64,
    /// `o2o`, `muc`, `muc-light`: seconds to wait for late deliveries
    /// after the ramp.
    #[arg(long, default_value_t = 3.0)]
    pub drain_secs: f64,
    /// `o2o`, `muc`, `muc-light`: stop the ramp after this many
    /// consecutive steps that did not keep up (single process only; 0 =
    /// run the whole ramp).
    #[arg(long, default_value_t = 2)]
    pub stop_after_fails: u32,
    /// `o2o`, `muc`, `muc-light`, `resume`: extra body bytes per message.
    #[arg(long, default_value_t = 0)]
    pub body_bytes: usize,
    /// `o2o`: address recipients by bare JID instead of user@domain/resource.
    #[arg(long)]
    pub to_bare: bool,
    /// `o2o`: instance price per hour, for the cost per billion delivered
    /// messages.
    #[arg(long)]
    pub hourly_price: Option<f64>,

    /// Internal: this process is worker I of --worker-count.
    #[arg(long, hide = true)]
    pub worker_index: Option<u64>,
    /// Internal: number of worker processes.
    #[arg(long, hide = true, default_value_t = 1)]
    pub worker_count: u64,
}

/// The kinds of archive queries the `archive` scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum QueryKind {
    /// The latest page: `<set><max>PAGE</max><before/></set>`.
    Latest,
    /// A page next to a message id picked at random from ids collected in
    /// the warm-up (`<after>ID</after>` or `<before>ID</before>`, half each).
    ById,
    /// The latest page of the conversation with one partner (`with` field).
    With,
}

impl QueryKind {
    /// The CLI and report name.
    pub fn name(self) -> &'static str {
        match self {
            QueryKind::Latest => "latest",
            QueryKind::ById => "by-id",
            QueryKind::With => "with",
        }
    }
}

/// Options of the `archive` scenario.
///
/// Measured users are `--first-user` … `--first-user + --users - 1`;
/// partner accounts (`--partners`, numbered from `--partner-first`, by
/// default right after the measured users) send the fill messages and are
/// the contacts of `with` queries, so provision users + partners accounts.
#[derive(Args, Debug, Clone)]
pub struct ArchiveArgs {
    /// Connection and output options (as for the other scenarios).
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Query kinds to run, comma-separated; each query picks one at random.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "latest,by-id,with"
    )]
    pub queries: Vec<QueryKind>,
    /// Results per page (RSM `<max>`). A server may enforce a lower maximum
    /// (Prosody: 50 by default); such pages are counted as `capped`.
    #[arg(long, default_value_t = 50)]
    pub page_size: u32,
    /// Seconds of measurement (after fill and warm-up).
    #[arg(long, default_value_t = 30.0)]
    pub duration_secs: f64,
    /// Total target rate in queries/s over all users (each user sends at
    /// rate/users on a fixed schedule, latency counted from the scheduled
    /// time). 0: closed loop, each user sends its next query as soon as the
    /// previous one finished.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Before measuring, send this many chat messages to each measured user
    /// from the partner accounts and wait until all are delivered (the
    /// server archives them). 0: measure the archive as it is.
    #[arg(long, default_value_t = 0)]
    pub fill: u64,
    /// Number of partner accounts (fill senders, `with` contacts).
    #[arg(long, default_value_t = 2)]
    pub partners: u64,
    /// Number of the first partner account (default: first-user + users).
    #[arg(long)]
    pub partner_first: Option<u64>,
    /// Total fill rate, messages/s.
    #[arg(long, default_value_t = 2000.0)]
    pub fill_rate: f64,
    /// Give up waiting for fill deliveries after this many seconds without
    /// progress.
    #[arg(long, default_value_t = 30.0)]
    pub fill_timeout_secs: f64,
    /// Warm-up (for `by-id`): time-range probes per user. Each picks a
    /// random instant between the user's oldest and newest archived
    /// message and asks for the first message from then on
    /// (`start` form field, `<max>1</max>`), so ids spread over the
    /// archive without assuming any server id format.
    #[arg(long, default_value_t = 20)]
    pub probes: u32,
    /// A query that has not completed (fin iq) after this many seconds
    /// counts as a `timeout` error.
    #[arg(long, default_value_t = 10.0)]
    pub query_timeout_secs: f64,
}

impl ArchiveArgs {
    /// Number of the first partner account.
    pub fn partner_first(&self) -> u64 {
        self.partner_first
            .unwrap_or(self.scenario.conn.first_user + self.scenario.conn.users)
    }
}

/// How to create accounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProvisionMethod {
    /// XEP-0077 in-band registration over the network (any server with
    /// registration open).
    Ibr,
    /// Write a Starling import file and run `starling user import`.
    StarlingImport,
    /// Only write the import file (`user@domain:password` lines) to --out.
    StarlingFile,
    /// `ejabberdctl register` per user (slow: one escript per call).
    Ejabberdctl,
    /// `prosodyctl register` per user (slow: one Lua start per call).
    Prosodyctl,
    /// Write Prosody's internal_hashed account files (SCRAM-SHA-1) directly
    /// into --prosody-data (server stopped or restarted afterwards).
    ProsodyFiles,
}

/// Options of `provision`.
#[derive(Args, Debug, Clone)]
pub struct ProvisionArgs {
    /// Method.
    #[arg(long, value_enum, default_value_t = ProvisionMethod::Ibr)]
    pub method: ProvisionMethod,
    /// Connection options (users, patterns; host/port/TLS for IBR).
    #[command(flatten)]
    pub conn: ConnArgs,
    /// `starling-import`: the starling binary.
    #[arg(long, default_value = "starling")]
    pub starling_bin: PathBuf,
    /// `starling-import`: the server's config file.
    #[arg(long)]
    pub starling_config: Option<PathBuf>,
    /// `starling-import`, `prosody-files`: PBKDF2 iterations.
    #[arg(long, default_value_t = 4096)]
    pub iterations: u32,
    /// `starling-file`, `starling-import`: where to write the import file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// `ejabberdctl`/`prosodyctl`: the command with leading arguments,
    /// e.g. "ejabberdctl --config-dir /x" (split on spaces).
    #[arg(long)]
    pub ctl: Option<String>,
    /// `prosody-files`: Prosody's data_path.
    #[arg(long)]
    pub prosody_data: Option<PathBuf>,
    /// `prosody-files`: chown the files to this user (e.g. prosody).
    #[arg(long)]
    pub chown: Option<String>,
}

impl ConnArgs {
    /// TCP connections one session uses (2 for BOSH).
    pub fn connections_per_session(&self) -> u64 {
        if self.transport == Carrier::Bosh {
            2
        } else {
            1
        }
    }

    /// The user name of user number `n`.
    pub fn user(&self, n: u64) -> String {
        self.user_pattern.replace("{n}", &n.to_string())
    }

    /// The password of user number `n`.
    pub fn password_of(&self, n: u64) -> String {
        self.password.replace("{n}", &n.to_string())
    }

    /// The source addresses to use for `total` connections.
    pub fn source_list(&self, total: u64) -> Vec<IpAddr> {
        if !self.sources.is_empty() {
            return self.sources.clone();
        }
        let k = total.div_ceil(25_000);
        if k <= 1 {
            return Vec::new();
        }
        (1..=k.min(250))
            .map(|i| IpAddr::from([127, 0, 0, i as u8]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_and_sources() {
        let cli = Cli::parse_from([
            "starling-bench",
            "o2o",
            "--users",
            "60000",
            "--user-pattern",
            "u{n}x",
            "--password",
            "p{n}",
            "--mechanism",
            "SCRAM-SHA-1",
        ]);
        let Command::O2o(a) = cli.command else {
            panic!()
        };
        assert_eq!(a.conn.user(7), "u7x");
        assert_eq!(a.conn.password_of(7), "p7");
        assert_eq!(a.conn.mechanism, Mech::ScramSha1);
        assert_eq!(a.conn.source_list(60_000).len(), 3);
        assert!(a.conn.source_list(1000).is_empty());
    }

    #[test]
    fn extra_ports_spread_users_over_nodes() {
        let cli = Cli::parse_from([
            "starling-bench",
            "o2o",
            "--port",
            "7000",
            "--extra-ports",
            "7001,7002",
        ]);
        let Command::O2o(a) = cli.command else {
            panic!()
        };
        let t = crate::engine::target_of(&a).unwrap();
        let ports: Vec<u16> = (0..6).map(|n| t.source_for(n).addr.port()).collect();
        assert_eq!(ports, [7000, 7001, 7002, 7000, 7001, 7002]);
        assert!(t.source_for(4).source.is_none());
    }

    #[test]
    fn archive_defaults_and_query_list() {
        let cli = Cli::parse_from(["starling-bench", "archive"]);
        let Command::Archive(a) = cli.command else {
            panic!()
        };
        assert_eq!(a.scenario.conn.users, 10, "archive defaults to 10 users");
        assert_eq!(
            a.queries,
            vec![QueryKind::Latest, QueryKind::ById, QueryKind::With]
        );
        assert_eq!(a.partner_first(), 11);
        let cli = Cli::parse_from([
            "starling-bench",
            "archive",
            "--users",
            "4",
            "--queries",
            "with,latest",
            "--page-size",
            "20",
        ]);
        let Command::Archive(a) = cli.command else {
            panic!()
        };
        assert_eq!(a.queries, vec![QueryKind::With, QueryKind::Latest]);
        assert_eq!(a.page_size, 20);
        assert_eq!(a.partner_first(), 5);
        // The other scenarios keep their default.
        let Command::O2o(o) = Cli::parse_from(["starling-bench", "o2o"]).command else {
            panic!()
        };
        assert_eq!(o.conn.users, 100);
    }

    #[test]
    fn bosh_sessions_count_twice_and_resume_implies_nothing_else() {
        let Command::Idle(a) = Cli::parse_from([
            "starling-bench",
            "idle",
            "--transport",
            "bosh",
            "--tls",
            "plain",
        ])
        .command
        else {
            panic!()
        };
        assert_eq!(a.conn.transport, Carrier::Bosh);
        assert_eq!(a.conn.bosh_wait, 60);
        assert_eq!(
            a.sessions_per_process(),
            9_500,
            "two connections per session"
        );
        let Command::Resume(r) =
            Cli::parse_from(["starling-bench", "resume", "--unacked", "100"]).command
        else {
            panic!()
        };
        assert_eq!(r.unacked, 100);
        assert!(!r.scenario.conn.sm, "the scenario turns --sm on by itself");
        assert_eq!(r.scenario.sessions_per_process(), 19_000);
        let Command::O2o(o) =
            Cli::parse_from(["starling-bench", "o2o", "--sm", "--sm-ack-every", "3"]).command
        else {
            panic!()
        };
        assert!(o.conn.sm);
        assert_eq!(o.conn.sm_ack_every, 3);
    }
}
