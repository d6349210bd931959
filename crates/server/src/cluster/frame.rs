//! The cluster bus's wire format: versioned binary messages, each a batch
//! of frames.
//!
//! ```text
//! message  = magic "SB" | version u8 | sender node u8 | incarnation u64 | frame*
//! frame    = kind u8 | length u32 | body (length bytes)
//! ```
//!
//! Integers are little-endian; a string is a u32 byte length and UTF-8
//! bytes; an optional value is a u8 flag (0 absent, 1 present) and the
//! value; a stanza or presence is its XML (default namespace
//! `jabber:client`). Every frame carries its own length, so a reader skips
//! the kinds it does not know: a node of a newer version may add kinds and
//! append fields to a body (older readers ignore the tail) without a
//! flag-day upgrade. A change that cannot be read that way bumps
//! [`VERSION`]; readers keep decoding every older version they were
//! released with (`tests::decodes_version_1`, a message recorded with
//! version 1, must keep passing).

use starling_core::SessionRef;
use starling_proto::{BareJid, FullJid, StreamError, StreamErrorCondition};
use starling_xml::{Element, Limits, StreamEvent, StreamParser};

/// The version this node writes.
pub const VERSION: u8 = 1;
const MAGIC: &[u8; 2] = b"SB";
/// Bytes before the first frame.
pub const HEADER_LEN: usize = 2 + 1 + 1 + 8;

/// Who sent a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The sending node's `node_id`.
    pub node: u8,
    /// The sending process's random incarnation: a restarted node with
    /// the same id has a new one, so others drop what they knew of it.
    pub incarnation: u64,
}

/// A session as the registry describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryState {
    /// The session.
    pub session: SessionRef,
    /// When it was bound, µs since the Unix epoch (of two binds of one
    /// full JID on different nodes, the later wins).
    pub bound_at: u64,
    /// Its availability: priority and last broadcast presence.
    pub presence: Option<(i8, Element)>,
}

/// Why a node asks another to close a session.
#[derive(Clone, Debug, PartialEq)]
pub enum CloseWhy {
    /// The same full JID was bound elsewhere (RFC 6120 §7.7.2.2).
    Replaced,
    /// A stream error condition and text.
    Error(StreamErrorCondition, Option<String>),
}

impl CloseWhy {
    /// The wire form of a close reason.
    pub fn from_reason(r: &starling_core::CloseReason) -> CloseWhy {
        match r {
            starling_core::CloseReason::Replaced => CloseWhy::Replaced,
            starling_core::CloseReason::Error(e) => CloseWhy::Error(e.condition, e.text.clone()),
        }
    }

    /// Back to a close reason.
    pub fn into_reason(self) -> starling_core::CloseReason {
        match self {
            CloseWhy::Replaced => starling_core::CloseReason::Replaced,
            CloseWhy::Error(c, text) => {
                let e = match text {
                    Some(t) => StreamError::with_text(c, t),
                    None => StreamError::new(c),
                };
                starling_core::CloseReason::Error(Box::new(e))
            }
        }
    }
}

/// One frame.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// "I am alive" (broadcast every heartbeat interval). `seq`: the
    /// sender's last registry event, so a receiver learns it missed one.
    Heartbeat {
        /// Last registry event number.
        seq: u64,
        /// Sessions bound on the sender.
        sessions: u32,
    },
    /// A session was bound on the sender (broadcast).
    Bound {
        /// Registry event number.
        seq: u64,
        /// The session.
        session: SessionRef,
        /// When, µs since the Unix epoch.
        bound_at: u64,
    },
    /// A session of the sender ended (broadcast).
    Unbound {
        /// Registry event number.
        seq: u64,
        /// The session.
        session: SessionRef,
    },
    /// A session's availability changed (broadcast).
    Presence {
        /// Registry event number.
        seq: u64,
        /// The session and its new state.
        entry: EntryState,
    },
    /// Every session of the sender, as of event `seq` (to one node), in
    /// one or more parts (a NATS message has a size limit).
    Snapshot {
        /// The sender's last registry event.
        seq: u64,
        /// Its sessions (this part's).
        entries: Vec<EntryState>,
        /// The first part: forget what you knew of the sender.
        first: bool,
        /// The last part: the snapshot is complete.
        last: bool,
    },
    /// "Send me your snapshot" (to one node).
    SyncRequest,
    /// A stanza for a session of the receiver.
    Deliver {
        /// The sender's number for it, acknowledged by [`Frame::Ack`]
        /// (0: no acknowledgement wanted).
        id: u64,
        /// The session.
        to: SessionRef,
        /// The stanza.
        stanza: Element,
    },
    /// These deliveries were put in their session's queue (or handed to
    /// the receiver's router when the session was gone).
    Ack {
        /// The [`Frame::Deliver`] ids.
        ids: Vec<u64>,
    },
    /// Run a module's timer handler in this session ([`starling_core::Router::notify`]).
    Notify {
        /// The session.
        to: SessionRef,
        /// The module's name.
        module: String,
        /// The module's token.
        token: u64,
    },
    /// Close this session.
    Close {
        /// The session.
        to: SessionRef,
        /// Why.
        why: CloseWhy,
    },
    /// Close every session of this account on the receiver.
    CloseAccount {
        /// The account.
        account: BareJid,
        /// Why.
        why: CloseWhy,
    },
    /// The sender is shutting down: forget its sessions now (broadcast).
    Leaving,
    /// A module's data changed: drop what is cached under `key` (broadcast).
    Invalidate {
        /// The module's name.
        module: String,
        /// The module's cache key.
        key: String,
    },
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Not a cluster bus message.
    #[error("not a cluster bus message")]
    BadMagic,
    /// Written by a newer version this node cannot read.
    #[error(
        "cluster bus message version {0} is newer than this node's ({VERSION}); upgrade this node"
    )]
    NewerVersion(u8),
    /// Cut short or inconsistent.
    #[error("malformed cluster bus message: {0}")]
    Malformed(&'static str),
}

/// Writes a message: a header, then frames.
pub struct Writer {
    buf: Vec<u8>,
    frames: usize,
}

impl Writer {
    /// A message from `header`.
    pub fn new(header: Header) -> Writer {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(MAGIC);
        buf.push(VERSION);
        buf.push(header.node);
        buf.extend_from_slice(&header.incarnation.to_le_bytes());
        Writer { buf, frames: 0 }
    }

    /// Appends one frame.
    pub fn push(&mut self, frame: &Frame) {
        let kind_at = self.buf.len();
        self.buf.push(0);
        let len_at = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        let body_at = self.buf.len();
        let kind = encode_body(&mut self.buf, frame);
        self.buf[kind_at] = kind;
        let len = (self.buf.len() - body_at) as u32;
        self.buf[len_at..body_at].copy_from_slice(&len.to_le_bytes());
        self.frames += 1;
    }

    /// Appends a frame already encoded by [`encode_frame`].
    pub fn push_encoded(&mut self, frame: &[u8]) {
        self.buf.extend_from_slice(frame);
        self.frames += 1;
    }

    /// Frames written so far.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when no frame was written.
    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    /// The message.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// One frame in its wire form (kind, length, body), for batching later.
pub fn encode_frame(frame: &Frame) -> Vec<u8> {
    let mut w = Writer {
        buf: Vec::with_capacity(128),
        frames: 0,
    };
    w.push(frame);
    w.buf
}

/// A [`Frame::Deliver`] in its wire form, without copying the stanza's
/// tree (the hot path of cross-node routing).
pub fn encode_deliver(id: u64, to: &SessionRef, stanza: &Element) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + stanza.size_hint());
    b.push(7);
    put_u32(&mut b, 0);
    put_u64(&mut b, id);
    put_session(&mut b, to);
    put_xml(&mut b, stanza);
    let len = (b.len() - 5) as u32;
    b[1..5].copy_from_slice(&len.to_le_bytes());
    b
}

/// Sets the id of a frame written by [`encode_deliver`] (it follows the
/// kind byte and the length).
pub fn set_deliver_id(frame: &mut [u8], id: u64) {
    frame[5..13].copy_from_slice(&id.to_le_bytes());
}

/// A snapshot of `entries` as of `seq`, split into parts of about
/// `max_bytes` each (always at least one part).
pub fn snapshot_parts(seq: u64, entries: Vec<EntryState>, max_bytes: usize) -> Vec<Frame> {
    let mut parts: Vec<Vec<EntryState>> = vec![Vec::new()];
    let mut size = 0;
    for e in entries {
        let n = 32
            + e.session.jid.as_str().len()
            + e.presence.as_ref().map_or(0, |(_, el)| el.size_hint());
        if size + n > max_bytes && !parts.last().expect("one part").is_empty() {
            parts.push(Vec::new());
            size = 0;
        }
        size += n;
        parts.last_mut().expect("one part").push(e);
    }
    let count = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, entries)| Frame::Snapshot {
            seq,
            entries,
            first: i == 0,
            last: i + 1 == count,
        })
        .collect()
}

/// Reads one frame in its wire form ([`encode_frame`], [`encode_deliver`]).
pub fn decode_frame(bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
    Reader { b: bytes }.frame()
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    put_u32(b, s.len() as u32);
    b.extend_from_slice(s.as_bytes());
}

fn put_xml(b: &mut Vec<u8>, el: &Element) {
    let at = b.len();
    put_u32(b, 0);
    let start = b.len();
    el.write_to(b, "jabber:client");
    let len = (b.len() - start) as u32;
    b[at..start].copy_from_slice(&len.to_le_bytes());
}

fn put_session(b: &mut Vec<u8>, s: &SessionRef) {
    put_str(b, s.jid.as_str());
    b.push(s.node);
    put_u64(b, s.id);
}

fn put_entry(b: &mut Vec<u8>, e: &EntryState) {
    put_session(b, &e.session);
    put_u64(b, e.bound_at);
    match &e.presence {
        None => b.push(0),
        Some((prio, el)) => {
            b.push(1);
            b.push(*prio as u8);
            put_xml(b, el);
        }
    }
}

fn put_why(b: &mut Vec<u8>, w: &CloseWhy) {
    match w {
        CloseWhy::Replaced => b.push(1),
        CloseWhy::Error(c, text) => {
            b.push(2);
            put_str(b, c.as_str());
            match text {
                None => b.push(0),
                Some(t) => {
                    b.push(1);
                    put_str(b, t);
                }
            }
        }
    }
}

/// Writes the body of `frame` and returns its kind byte.
fn encode_body(b: &mut Vec<u8>, frame: &Frame) -> u8 {
    match frame {
        Frame::Heartbeat { seq, sessions } => {
            put_u64(b, *seq);
            put_u32(b, *sessions);
            1
        }
        Frame::Bound {
            seq,
            session,
            bound_at,
        } => {
            put_u64(b, *seq);
            put_session(b, session);
            put_u64(b, *bound_at);
            2
        }
        Frame::Unbound { seq, session } => {
            put_u64(b, *seq);
            put_session(b, session);
            3
        }
        Frame::Presence { seq, entry } => {
            put_u64(b, *seq);
            put_entry(b, entry);
            4
        }
        Frame::Snapshot {
            seq,
            entries,
            first,
            last,
        } => {
            put_u64(b, *seq);
            put_u32(b, entries.len() as u32);
            for e in entries {
                put_entry(b, e);
            }
            b.push(u8::from(*first) | u8::from(*last) << 1);
            5
        }
        Frame::SyncRequest => 6,
        Frame::Deliver { id, to, stanza } => {
            put_u64(b, *id);
            put_session(b, to);
            put_xml(b, stanza);
            7
        }
        Frame::Ack { ids } => {
            put_u32(b, ids.len() as u32);
            for id in ids {
                put_u64(b, *id);
            }
            8
        }
        Frame::Notify { to, module, token } => {
            put_session(b, to);
            put_str(b, module);
            put_u64(b, *token);
            9
        }
        Frame::Close { to, why } => {
            put_session(b, to);
            put_why(b, why);
            10
        }
        Frame::CloseAccount { account, why } => {
            put_str(b, account.as_str());
            put_why(b, why);
            11
        }
        Frame::Leaving => 12,
        Frame::Invalidate { module, key } => {
            put_str(b, module);
            put_str(b, key);
            13
        }
    }
}

/// Reads a message: its header and the frames this version knows.
pub fn decode(msg: &[u8]) -> Result<(Header, Vec<Frame>), FrameError> {
    if msg.len() < HEADER_LEN || &msg[..2] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let version = msg[2];
    if version > VERSION || version == 0 {
        return Err(FrameError::NewerVersion(version));
    }
    let header = Header {
        node: msg[3],
        incarnation: u64::from_le_bytes(msg[4..12].try_into().expect("8 bytes")),
    };
    let mut r = Reader {
        b: &msg[HEADER_LEN..],
    };
    let mut frames = Vec::new();
    while !r.b.is_empty() {
        if let Some(f) = r.frame()? {
            frames.push(f);
        }
    }
    Ok((header, frames))
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    /// The next frame (`None`: a kind this version does not know).
    fn frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let kind = self.u8()?;
        let len = self.u32()? as usize;
        let body = self.take(len)?;
        decode_body(kind, body)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.b.len() < n {
            return Err(FrameError::Malformed("cut short"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> Result<&'a str, FrameError> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| FrameError::Malformed("not UTF-8"))
    }
    fn flag(&mut self) -> Result<bool, FrameError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FrameError::Malformed("bad flag")),
        }
    }
    fn xml(&mut self) -> Result<Element, FrameError> {
        let n = self.u32()? as usize;
        parse_xml(self.take(n)?)
    }
    fn session(&mut self) -> Result<SessionRef, FrameError> {
        let jid = FullJid::new(self.str()?).map_err(|_| FrameError::Malformed("bad JID"))?;
        Ok(SessionRef {
            jid,
            node: self.u8()?,
            id: self.u64()?,
        })
    }
    fn entry(&mut self) -> Result<EntryState, FrameError> {
        let session = self.session()?;
        let bound_at = self.u64()?;
        let presence = if self.flag()? {
            let prio = self.u8()? as i8;
            Some((prio, self.xml()?))
        } else {
            None
        };
        Ok(EntryState {
            session,
            bound_at,
            presence,
        })
    }
    fn why(&mut self) -> Result<CloseWhy, FrameError> {
        match self.u8()? {
            1 => Ok(CloseWhy::Replaced),
            2 => {
                let c = StreamErrorCondition::from_str(self.str()?)
                    .unwrap_or(StreamErrorCondition::UndefinedCondition);
                let text = if self.flag()? {
                    Some(self.str()?.to_owned())
                } else {
                    None
                };
                Ok(CloseWhy::Error(c, text))
            }
            _ => Err(FrameError::Malformed("bad close reason")),
        }
    }
}

/// Stanzas on the bus were written by a node; the limits still apply.
fn parse_xml(bytes: &[u8]) -> Result<Element, FrameError> {
    let mut p = StreamParser::for_elements(Limits::default());
    let mut input = bytes;
    match p.push(&mut input) {
        Ok(Some(StreamEvent::Stanza(el))) if input.is_empty() => Ok(el),
        _ => Err(FrameError::Malformed("bad stanza XML")),
    }
}

/// `Ok(None)`: a kind this version does not know (skipped).
fn decode_body(kind: u8, body: &[u8]) -> Result<Option<Frame>, FrameError> {
    let mut r = Reader { b: body };
    let f = match kind {
        1 => Frame::Heartbeat {
            seq: r.u64()?,
            sessions: r.u32()?,
        },
        2 => Frame::Bound {
            seq: r.u64()?,
            session: r.session()?,
            bound_at: r.u64()?,
        },
        3 => Frame::Unbound {
            seq: r.u64()?,
            session: r.session()?,
        },
        4 => Frame::Presence {
            seq: r.u64()?,
            entry: r.entry()?,
        },
        5 => {
            let seq = r.u64()?;
            let n = r.u32()? as usize;
            // Each entry takes at least 14 bytes: never trust a count.
            let mut entries = Vec::with_capacity(n.min(body.len() / 14));
            for _ in 0..n {
                entries.push(r.entry()?);
            }
            // Parts (appended in version 1; none: a whole snapshot).
            let parts = if r.b.is_empty() { 0b11 } else { r.u8()? };
            Frame::Snapshot {
                seq,
                entries,
                first: parts & 1 != 0,
                last: parts & 2 != 0,
            }
        }
        6 => Frame::SyncRequest,
        7 => Frame::Deliver {
            id: r.u64()?,
            to: r.session()?,
            stanza: r.xml()?,
        },
        8 => {
            let n = r.u32()? as usize;
            let mut ids = Vec::with_capacity(n.min(body.len() / 8));
            for _ in 0..n {
                ids.push(r.u64()?);
            }
            Frame::Ack { ids }
        }
        9 => Frame::Notify {
            to: r.session()?,
            module: r.str()?.to_owned(),
            token: r.u64()?,
        },
        10 => Frame::Close {
            to: r.session()?,
            why: r.why()?,
        },
        11 => Frame::CloseAccount {
            account: BareJid::new(r.str()?).map_err(|_| FrameError::Malformed("bad JID"))?,
            why: r.why()?,
        },
        12 => Frame::Leaving,
        13 => Frame::Invalidate {
            module: r.str()?.to_owned(),
            key: r.str()?.to_owned(),
        },
        _ => return Ok(None),
    };
    Ok(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(jid: &str, node: u8, id: u64) -> SessionRef {
        SessionRef {
            jid: FullJid::new(jid).unwrap(),
            node,
            id,
        }
    }

    fn every_kind() -> Vec<Frame> {
        let presence = Element::builder("presence", "jabber:client")
            .attr("from", "a@x/r")
            .append(
                Element::builder("show", "jabber:client")
                    .text("away")
                    .build(),
            )
            .build();
        let msg = Element::builder("message", "jabber:client")
            .attr("to", "b@x/r")
            .attr("type", "chat")
            .append(
                Element::builder("body", "jabber:client")
                    .text("héllo <&>")
                    .build(),
            )
            .append(Element::new(
                "active",
                "http://jabber.org/protocol/chatstates",
            ))
            .build();
        vec![
            Frame::Heartbeat {
                seq: 7,
                sessions: 3,
            },
            Frame::Bound {
                seq: 8,
                session: session("a@x/r", 2, 42),
                bound_at: 1_700_000_000_000_000,
            },
            Frame::Unbound {
                seq: 9,
                session: session("a@x/r", 2, 42),
            },
            Frame::Presence {
                seq: 10,
                entry: EntryState {
                    session: session("a@x/r", 2, 43),
                    bound_at: 5,
                    presence: Some((-1, presence.clone())),
                },
            },
            Frame::Snapshot {
                seq: 10,
                first: true,
                last: false,
                entries: vec![
                    EntryState {
                        session: session("a@x/r", 2, 43),
                        bound_at: 5,
                        presence: Some((5, presence)),
                    },
                    EntryState {
                        session: session("c@x/phone", 2, 44),
                        bound_at: 6,
                        presence: None,
                    },
                ],
            },
            Frame::SyncRequest,
            Frame::Deliver {
                id: 99,
                to: session("b@x/r", 1, 5),
                stanza: msg,
            },
            Frame::Ack { ids: vec![99, 100] },
            Frame::Notify {
                to: session("b@x/r", 1, 5),
                module: "offline".into(),
                token: 1,
            },
            Frame::Close {
                to: session("b@x/r", 1, 5),
                why: CloseWhy::Replaced,
            },
            Frame::CloseAccount {
                account: BareJid::new("b@x").unwrap(),
                why: CloseWhy::Error(
                    StreamErrorCondition::NotAuthorized,
                    Some("account deleted".into()),
                ),
            },
            Frame::Leaving,
            Frame::Invalidate {
                module: "blocking".into(),
                key: "a@x".into(),
            },
        ]
    }

    #[test]
    fn every_frame_kind_round_trips_in_one_batch() {
        let h = Header {
            node: 2,
            incarnation: 0x0102_0304_0506_0708,
        };
        let mut w = Writer::new(h);
        for f in every_kind() {
            w.push(&f);
        }
        // Pre-encoded frames batch the same way.
        w.push_encoded(&encode_frame(&Frame::Leaving));
        // The hot path's encoder writes what the generic one does.
        for f in every_kind() {
            if let Frame::Deliver { id, to, stanza } = &f {
                let mut fast = encode_deliver(0, to, stanza);
                set_deliver_id(&mut fast, *id);
                assert_eq!(fast, encode_frame(&f));
                assert_eq!(decode_frame(&fast).unwrap(), Some(f.clone()));
            }
        }
        assert_eq!(w.frames(), 14);
        let (h2, frames) = decode(&w.finish()).unwrap();
        assert_eq!(h2, h);
        let mut want = every_kind();
        want.push(Frame::Leaving);
        assert_eq!(frames, want);
    }

    /// A message written by version 1 (recorded when version 1 was
    /// current): later versions must still read it, so a cluster can be
    /// upgraded one node at a time.
    #[test]
    fn decodes_version_1() {
        const V1: &str = "534201020900000000000000010c00000007000000000000000300000002220000000800000000000000050000006240782f72022a000000000000004d00000000000000";
        let bytes: Vec<u8> = (0..V1.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&V1[i..i + 2], 16).unwrap())
            .collect();
        let (h, frames) = decode(&bytes).unwrap();
        assert_eq!(
            h,
            Header {
                node: 2,
                incarnation: 9
            }
        );
        assert_eq!(
            frames,
            vec![
                Frame::Heartbeat {
                    seq: 7,
                    sessions: 3
                },
                Frame::Bound {
                    seq: 8,
                    session: session("b@x/r", 2, 42),
                    bound_at: 77
                },
            ]
        );
    }

    #[test]
    fn large_snapshots_go_in_parts_that_fit_a_nats_message() {
        let entry = |i: u64| EntryState {
            session: session(&format!("user{i}@example.org/phone"), 2, i),
            bound_at: i,
            presence: Some((
                0,
                Element::builder("presence", "jabber:client")
                    .append(
                        Element::builder("status", "jabber:client")
                            .text("x".repeat(200))
                            .build(),
                    )
                    .build(),
            )),
        };
        let parts = snapshot_parts(7, (0..20_000).map(entry).collect(), 256 * 1024);
        assert!(parts.len() > 10, "{}", parts.len());
        let mut total = 0;
        for (i, p) in parts.iter().enumerate() {
            let bytes = encode_frame(p);
            assert!(bytes.len() < 300 * 1024, "part {i}: {} bytes", bytes.len());
            let Some(Frame::Snapshot {
                seq,
                entries,
                first,
                last,
            }) = decode_frame(&bytes).unwrap()
            else {
                panic!("a snapshot part")
            };
            assert_eq!((seq, first, last), (7, i == 0, i + 1 == parts.len()));
            total += entries.len();
        }
        assert_eq!(total, 20_000);
        // No sessions: one empty part, first and last.
        assert_eq!(
            snapshot_parts(3, Vec::new(), 1024),
            [Frame::Snapshot {
                seq: 3,
                entries: Vec::new(),
                first: true,
                last: true
            }]
        );
    }

    #[test]
    fn unknown_kinds_and_appended_fields_are_skipped() {
        let mut w = Writer::new(Header {
            node: 1,
            incarnation: 1,
        });
        w.push(&Frame::SyncRequest);
        let mut msg = w.finish();
        // A kind from a newer node, then a heartbeat with an extra field.
        msg.extend_from_slice(&[200, 3, 0, 0, 0, 1, 2, 3]);
        msg.push(1);
        msg.extend_from_slice(&14u32.to_le_bytes());
        msg.extend_from_slice(&5u64.to_le_bytes());
        msg.extend_from_slice(&1u32.to_le_bytes());
        msg.extend_from_slice(&[0xEE, 0xEE]);
        let (_, frames) = decode(&msg).unwrap();
        assert_eq!(
            frames,
            vec![
                Frame::SyncRequest,
                Frame::Heartbeat {
                    seq: 5,
                    sessions: 1
                }
            ]
        );
    }

    #[test]
    fn bad_messages_are_refused_not_panicked_on() {
        assert_eq!(decode(b"hello world!!"), Err(FrameError::BadMagic));
        assert_eq!(decode(b"SB"), Err(FrameError::BadMagic));
        let mut newer = Writer::new(Header {
            node: 1,
            incarnation: 1,
        })
        .finish();
        newer[2] = VERSION + 1;
        assert_eq!(decode(&newer), Err(FrameError::NewerVersion(VERSION + 1)));
        // Every truncation of a valid message is an error or a prefix.
        let mut w = Writer::new(Header {
            node: 1,
            incarnation: 1,
        });
        for f in every_kind() {
            w.push(&f);
        }
        let full = w.finish();
        for cut in HEADER_LEN..full.len() {
            let _ = decode(&full[..cut]);
        }
        // A huge count with no entries behind it.
        let mut w = Writer::new(Header {
            node: 1,
            incarnation: 1,
        });
        w.push(&Frame::Ack { ids: vec![] });
        let mut msg = w.finish();
        let n = msg.len();
        msg[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&msg).is_err());
        // Stanza XML that is not well-formed.
        let mut w = Writer::new(Header {
            node: 1,
            incarnation: 1,
        });
        w.push(&Frame::Notify {
            to: session("a@x/r", 1, 1),
            module: "m".into(),
            token: 0,
        });
        let mut msg = w.finish();
        msg[HEADER_LEN] = 7; // reinterpret as Deliver: garbage inside
        assert!(decode(&msg).is_err());
    }
}
