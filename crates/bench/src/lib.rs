//! starling-bench: a load generator for XMPP servers, in the spirit of
//! MongooseIM's amoc, usable against any server (Starling, ejabberd,
//! Prosody…).
//!
//! Code map:
//! - [`cli`]: command-line options.
//! - [`client`]: the lean XMPP client (TCP/STARTTLS/direct TLS, PLAIN/SCRAM,
//!   bind, in-band registration), failures classified by cause.
//! - [`bosh`]: the BOSH (XEP-0124/0206) client as a byte stream, two
//!   hand-written HTTP/1.1 keep-alive connections per session.
//! - [`archive`]: scenario `archive`: XEP-0313 MAM query latency (latest
//!   page, page by id, filtered by contact), archive fill, page checks.
//! - [`engine`]: scenarios `connect`, `idle`, `o2o`: connection storm with
//!   bounded concurrency, per-connection reader/writer tasks, the rate
//!   ramp (shared with `muc`), latency recording.
//! - [`muc`]: scenario `muc`: XEP-0045 rooms, the join storm (creation,
//!   locked rooms, instant-room form), a ramp of groupchat messages with
//!   every occupant's copy timed, and per message the last copy.
//! - [`muc_light`]: scenario `muc-light`: MUC Light (`urn:xmpp:muclight:0`)
//!   rooms created with their members in one iq each, then the same ramp
//!   (every member's copy timed), server memory per session and per room.
//! - [`rooms`]: what `muc` and `muc-light` share: the run (login storm
//!   with presence, the ramp, output), rooms of consecutive users, the
//!   per-message copy bookkeeping, the setup phases' plumbing.
//! - [`pep`]: scenario `pep`: XEP-0163 personal eventing at login —
//!   contacts subscribed and items published over XMPP, then a login
//!   storm with XEP-0115 caps (`+notify`), every notification counted and
//!   timed per login.
//! - [`resume`]: scenario `resume`: XEP-0198 resumption vs login, memory
//!   of detached sessions with unacknowledged messages.
//! - [`workers`]: beyond one process's file limit, the coordinator starts
//!   copies of itself and merges their JSON results (histograms travel in
//!   HDR V2 form, so merged percentiles are exact).
//! - [`rate`], [`hist`], [`report`]: rate ramp, histograms, results.
//! - [`provision`]: creating N accounts (IBR, Starling bulk import,
//!   ejabberdctl/prosodyctl, Prosody's account files).
//! - [`procmem`]: server RSS and PID from `/proc`.

pub mod archive;
pub mod bosh;
pub mod cli;
pub mod client;
pub mod engine;
pub mod hist;
pub mod muc;
pub mod muc_light;
pub mod pep;
pub mod procmem;
pub mod provision;
pub mod rate;
pub mod report;
pub mod resume;
pub mod rooms;
pub mod workers;

use clap::Parser as _;

/// Entry point of the binary.
pub fn main_entry() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cli.command {
            cli::Command::Connect(a) => engine::run(engine::Scenario::Connect, a).await,
            cli::Command::Idle(a) => engine::run(engine::Scenario::Idle, a).await,
            cli::Command::O2o(a) => engine::run(engine::Scenario::O2o, a).await,
            cli::Command::MucLight(a) => muc_light::run(a).await,
            cli::Command::Muc(a) => muc::run(a).await,
            cli::Command::Archive(a) => archive::run(a).await,
            cli::Command::Resume(a) => resume::run(a).await,
            cli::Command::Pep(a) => pep::run(a).await,
            cli::Command::Provision(p) => provision::run(p).await,
        }
    })
}
