//! Routing and the session table, as interfaces.
//!
//! The local implementations live in the server crate. A clustered
//! deployment implements [`Router`] by consulting the local table first and a
//! shared registry second, so modules never learn where a session lives.

use crate::Env;
use async_trait::async_trait;
use starling_proto::{BareJid, FullJid, Stanza, StreamError};
use starling_xml::Element;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Routes stanzas to local sessions, local services or remote domains
/// (RFC 6120 §10, RFC 6121 §8).
#[async_trait]
pub trait Router: Send + Sync + 'static {
    /// Routes one stanza whose `from` is already set and trusted. Errors
    /// owed to the sender (service-unavailable and the like) are routed back
    /// by the router itself.
    async fn route(&self, env: &Env, stanza: Stanza);
}

/// Why a session is being closed by someone other than its own client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// Another session bound the same full JID (RFC 6120 §7.7.2.2): close
    /// with `<conflict/>`.
    Replaced,
    /// Close with this stream error (boxed: it is rare, and keeping
    /// [`SessionMsg`] small keeps every idle mailbox small).
    Error(Box<StreamError>),
}

/// A message to a session task's mailbox.
///
/// Kept at 16 bytes: tokio's bounded channel allocates its first block of
/// 32 slots when the channel is created, so every idle session pays
/// 32 × `size_of::<SessionMsg>()`.
#[derive(Debug)]
pub enum SessionMsg {
    /// Deliver this stanza to the client (after the receive hooks).
    Stanza(Box<Stanza>),
    /// Close the session.
    Close(CloseReason),
}

/// Why a message could not be put in a session's mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionSendError {
    /// The mailbox is full: the client is not reading fast enough.
    Full,
    /// The session task has ended.
    Gone,
}

/// The address of a session task: its id and its bounded mailbox.
#[derive(Clone, Debug)]
pub struct SessionHandle {
    /// Process-unique session id.
    pub id: u64,
    tx: mpsc::Sender<SessionMsg>,
}

impl SessionHandle {
    /// A handle to the mailbox `tx`.
    pub fn new(id: u64, tx: mpsc::Sender<SessionMsg>) -> Self {
        SessionHandle { id, tx }
    }

    /// Puts a message in the mailbox without waiting: a router never blocks
    /// on a slow recipient. On failure the message is handed back.
    pub fn try_send(&self, msg: SessionMsg) -> Result<(), (SessionSendError, SessionMsg)> {
        self.tx.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(m) => (SessionSendError::Full, m),
            mpsc::error::TrySendError::Closed(m) => (SessionSendError::Gone, m),
        })
    }
}

/// One bound resource in the session table.
#[derive(Clone, Debug)]
pub struct SessionEntry {
    /// The bound full JID.
    pub jid: FullJid,
    /// Presence priority; `None` while the resource is not available
    /// (no initial presence sent yet, or unavailable presence sent).
    pub priority: Option<i8>,
    /// The resource's last available presence as broadcast (with its
    /// `from`), for answering probes (RFC 6121 §4.3.2); `None` while not
    /// available.
    pub presence: Option<Arc<Element>>,
    /// The session's mailbox.
    pub handle: SessionHandle,
}

/// The local session table: bare JID → bound resources.
///
/// Methods are synchronous and never block: implementations use short,
/// sharded locks that are never held across an `.await`.
pub trait SessionManager: Send + Sync + 'static {
    /// Binds `jid` to `handle`. If a session already holds this full JID it
    /// is replaced and its handle returned, so the caller can tell it to
    /// close with `<conflict/>`.
    fn register(&self, jid: &FullJid, handle: SessionHandle) -> Option<SessionHandle>;
    /// Removes `jid` if it is still held by session `session_id`.
    fn unregister(&self, jid: &FullJid, session_id: u64);
    /// Records the resource's availability: priority and last presence
    /// (`None` = unavailable).
    fn set_presence(&self, jid: &FullJid, session_id: u64, presence: Option<(i8, Arc<Element>)>);
    /// The session holding exactly this full JID.
    fn get(&self, jid: &FullJid) -> Option<SessionEntry>;
    /// All bound resources of an account.
    fn resources(&self, bare: &BareJid) -> Vec<SessionEntry>;
    /// Number of bound sessions on this node.
    fn count(&self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_msg_stays_two_words() {
        assert!(
            std::mem::size_of::<SessionMsg>() <= 16,
            "{}",
            std::mem::size_of::<SessionMsg>()
        );
    }
}
