//! Client-to-server connections.
//!
//! One tokio task per connection ([`session`]) owns the socket, the XML
//! parser, the session's facts and every module's per-session state
//! (DESIGN.md invariant 2). It performs RFC 6120 negotiation — stream
//! headers (§4), STARTTLS (§5), SASL (§6), resource binding (§7) and the
//! legacy session iq — and hands every stanza to the hooks. It knows no XEP
//! (invariant 1): presence, ping, disco, registration… are modules.

pub(crate) mod fast;
pub(crate) mod session;

use crate::config::Config;
use crate::limiter::IpLimiter;
use crate::tls::TlsContext;
use starling_core::Env;
use starling_proto::sasl::Mechanism;
use starling_xml::Limits;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

impl C2sShared {
    /// `[c2s]` read-rate limit and parser hibernation, for every
    /// client connection (TCP/TLS, WebSocket; for BOSH only the rate).
    pub(crate) fn read_limits(&self) -> crate::transport::connection::ReadLimits {
        crate::transport::connection::ReadLimits::from_c2s(
            self.max_bytes_per_second,
            self.limits.max_stanza_bytes,
            self.hibernate_after,
        )
    }
}

/// Settings and shared state of all client sessions.
pub struct C2sShared {
    /// The server environment.
    pub env: Arc<Env>,
    /// TLS material; `None` only in tests that run without certificates.
    pub tls: Option<TlsContext>,
    /// XML limits per stanza.
    pub limits: Limits,
    /// Largest element, WebSocket message or BOSH body before
    /// authentication (`[c2s] max_preauth_stanza_bytes`).
    pub preauth_stanza_bytes: usize,
    /// Output held for a BOSH client between requests, and the most one
    /// response carries (`[c2s] bosh_max_pending_bytes`).
    pub bosh_max_pending_bytes: usize,
    /// STARTTLS required before authentication.
    pub require_tls: bool,
    /// Time allowed to authenticate and bind.
    pub negotiation_timeout: Duration,
    /// Failed SASL attempts per stream before `<policy-violation/>`.
    pub max_auth_attempts: u32,
    /// Mailbox capacity per session.
    pub mailbox_size: usize,
    /// Most bytes of stanzas a session's mailbox holds (`[c2s] mailbox_bytes`).
    pub mailbox_bytes: usize,
    /// Resources one account may have bound at once (`[c2s]
    /// max_resources_per_account`).
    pub max_resources_per_account: usize,
    /// Longest time a write may block.
    pub write_timeout: Duration,
    /// Sustained read rate per session in bytes/s (0 = unlimited).
    pub max_bytes_per_second: u64,
    /// Quiet time before the XML parser hibernates (`None`: never).
    pub hibernate_after: Option<Duration>,
    /// Configured mechanisms, strongest first.
    pub mechanisms: Vec<Mechanism>,
    /// SCRAM iteration count (so challenges for unknown users look real).
    pub scram_iterations: u32,
    /// Authentication failures per IP address.
    pub auth_limiter: IpLimiter,
    /// Source of session ids.
    pub next_id: AtomicU64,
    /// XEP-0484 FAST tokens (`None`: not offered).
    pub fast: Option<fast::Fast>,
    /// The server's secret (`data_dir/fast.key`): FAST tokens and stable
    /// Bind 2 resources derive from it.
    pub key: Option<[u8; 32]>,
}

impl C2sShared {
    /// Builds the shared state from the configuration.
    pub fn new(env: Arc<Env>, tls: Option<TlsContext>, cfg: &Config) -> Self {
        let mut mechanisms: Vec<Mechanism> = cfg
            .auth
            .mechanisms
            .iter()
            .filter_map(|m| Mechanism::from_name(m))
            .collect();
        // Strongest first, whatever order the file lists them in.
        mechanisms.sort_by_key(|m| Mechanism::ALL.iter().position(|x| x == m));
        mechanisms.dedup();
        let key = match fast::load_or_create_key(&cfg.server.data_dir) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::error!(error = %e, "FAST tokens (XEP-0484) and stable Bind 2 resources are off: the key is unusable");
                None
            }
        };
        C2sShared {
            env,
            tls,
            limits: Limits {
                max_stanza_bytes: cfg.c2s.max_stanza_bytes,
                max_depth: cfg.c2s.max_depth,
                max_attributes: cfg.c2s.max_attributes,
                ..Limits::default()
            },
            preauth_stanza_bytes: cfg.c2s.max_preauth_stanza_bytes,
            bosh_max_pending_bytes: cfg.c2s.bosh_max_pending_bytes,
            require_tls: cfg.c2s.require_tls,
            negotiation_timeout: Duration::from_secs(cfg.c2s.negotiation_timeout_secs),
            max_auth_attempts: cfg.c2s.max_auth_attempts,
            mailbox_size: cfg.c2s.mailbox_size,
            mailbox_bytes: cfg.c2s.mailbox_bytes,
            max_resources_per_account: cfg.c2s.max_resources_per_account,
            write_timeout: Duration::from_secs(cfg.c2s.write_timeout_secs),
            max_bytes_per_second: cfg.c2s.max_bytes_per_second,
            hibernate_after: match cfg.c2s.hibernate_after_secs {
                0 => None,
                s => Some(Duration::from_secs(s)),
            },
            mechanisms,
            scram_iterations: cfg.auth.scram_iterations,
            auth_limiter: IpLimiter::new(
                cfg.auth.max_failures_per_ip,
                Duration::from_secs(cfg.auth.failure_window_secs),
            ),
            next_id: AtomicU64::new(1),
            fast: key.filter(|_| cfg.auth.fast_token_days > 0).map(|k| {
                fast::Fast::new(
                    k,
                    Duration::from_secs(u64::from(cfg.auth.fast_token_days) * 86_400),
                )
            }),
            key,
        }
    }
}
