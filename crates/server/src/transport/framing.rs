//! What every kind of connection shares with its session, apart from the
//! [`Connection`](super::connection::Connection) enum that chooses among
//! them: the events a connection hands its session ([`Inbound`]), how
//! input ends ([`IoEnd`]), how output ends ([`Closing`]), and the read
//! budget every kind enforces ([`ReadLimits`], [`ReadGovernor`]). The
//! framings (`connection.rs`'s XML stream, `websocket.rs`, `bosh.rs`)
//! depend on this file and not on each other.

use starling_proto::StreamError;
use starling_xml::{Element, StreamHeader, StreamParser};
use std::time::{Duration, Instant};

/// What a connection hands its session.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// The client opened its stream, or reopened it after a restart
    /// (RFC 6120 §4.2, §4.3.3).
    Open(StreamHeader),
    /// A complete top-level element (a stanza, or a negotiation element).
    Element(Element),
    /// The client closed its stream (RFC 6120 §4.4).
    Close,
}

/// Why a connection ended without a closing handshake: the `reason` field
/// of the "session closed" log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoEnd {
    /// The client closed the TCP connection.
    Eof,
    /// Reading from the socket failed (reset, TLS error…).
    ReadError,
    /// Writing to the socket failed.
    WriteError,
    /// A write did not complete within `[c2s] write_timeout_secs`: the
    /// client stopped reading and its socket buffer is full.
    WriteTimeout,
    /// STARTTLS failed or was refused.
    Tls,
}

/// How the session ends its stream.
#[derive(Debug)]
pub(crate) enum Closing<'a> {
    /// With this stream error (RFC 6120 §4.9), then the closing tag.
    Error(&'a StreamError),
    /// With the closing tag only: the client closed first (§4.4).
    Close,
}

/// Read-rate limiting settings of a connection (`[c2s] max_bytes_per_second`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadLimits {
    /// Sustained read rate in bytes/s; 0 = unlimited.
    pub bytes_per_second: u64,
    /// Largest burst, in bytes (at least one maximal stanza).
    pub burst: u64,
    /// Quiet time before the XML parser frees its state (`None`: never).
    pub hibernate_after: Option<Duration>,
}

impl ReadLimits {
    /// The limits of `[c2s]`: the burst covers at least one maximal stanza.
    pub(crate) fn from_c2s(
        bytes_per_second: u64,
        max_stanza_bytes: usize,
        hibernate_after: Option<Duration>,
    ) -> ReadLimits {
        ReadLimits {
            bytes_per_second,
            burst: bytes_per_second.max(max_stanza_bytes as u64),
            hibernate_after,
        }
    }
}

/// What every stream-carrying connection (TCP/TLS, WebSocket) does about
/// reading: a token bucket over bytes read (past the burst, reading pauses
/// until it refills) and the idle parser's hibernation deadline.
pub(crate) struct ReadGovernor {
    limits: ReadLimits,
    tokens: f64,
    refilled_at: Instant,
    /// Reading is paused until then.
    pub(crate) paused_until: Option<Instant>,
    /// When the idle parser should hibernate.
    pub(crate) hibernate_at: Option<Instant>,
}

impl ReadGovernor {
    pub(crate) fn new(limits: ReadLimits) -> ReadGovernor {
        ReadGovernor {
            limits,
            tokens: limits.burst as f64,
            refilled_at: Instant::now(),
            paused_until: None,
            hibernate_at: None,
        }
    }

    /// Counts `n` bytes read; pauses reading when over the rate.
    pub(crate) fn throttle(&mut self, n: usize) {
        let rate = self.limits.bytes_per_second as f64;
        if rate <= 0.0 {
            return;
        }
        let burst = self.limits.burst as f64;
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled_at).as_secs_f64();
        self.refilled_at = now;
        self.tokens = (self.tokens + elapsed * rate).min(burst) - n as f64;
        if self.tokens < 0.0 {
            self.paused_until = Some(now + Duration::from_secs_f64(-self.tokens / rate));
        }
    }

    /// All input is parsed: the parser may hibernate after the quiet time.
    pub(crate) fn idle(&mut self) {
        self.hibernate_at = self.limits.hibernate_after.map(|d| Instant::now() + d);
    }

    /// The earliest instant [`ReadGovernor::on_deadline`] acts.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        [self.paused_until, self.hibernate_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// Resumes reading and hibernates `parser` when their time has come.
    pub(crate) fn on_deadline(&mut self, now: Instant, parser: &mut StreamParser) {
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
        }
        if self.hibernate_at.is_some_and(|t| t <= now) {
            self.hibernate_at = None;
            parser.hibernate();
        }
    }
}
