//! The per-session view of the user's roster (RFC 6121 §2): kept by the
//! roster module in the session's [`crate::Extensions`], read by the
//! presence module for its fan-out. This type is the contract between the
//! two, so neither module imports the other.

use crate::storage::{RosterItem, Subscription};
use starling_proto::BareJid;
use std::collections::HashMap;

/// Per-session roster state.
#[derive(Default)]
pub struct SessionRoster {
    /// The session asked for the roster (RFC 6121 §2.2): it gets pushes.
    pub interested: bool,
    /// The roster's subscription states, once loaded (roster get or
    /// initial presence) and kept current by pushes.
    pub contacts: Option<HashMap<BareJid, Subscription>>,
    /// The roster version the cache reflects.
    pub version: u64,
}

impl SessionRoster {
    /// Contacts that receive the user's presence (subscription from/both).
    pub fn subscribers(&self) -> impl Iterator<Item = &BareJid> {
        self.contacts
            .iter()
            .flatten()
            .filter(|(_, s)| s.has_from())
            .map(|(j, _)| j)
    }

    /// Contacts whose presence the user receives (subscription to/both).
    pub fn subscriptions(&self) -> impl Iterator<Item = &BareJid> {
        self.contacts
            .iter()
            .flatten()
            .filter(|(_, s)| s.has_to())
            .map(|(j, _)| j)
    }

    /// True if `contact` receives the user's presence.
    pub fn is_subscriber(&self, contact: &BareJid) -> bool {
        self.contacts
            .as_ref()
            .and_then(|c| c.get(contact))
            .is_some_and(|s| s.has_from())
    }

    /// Replaces the cache with a loaded roster.
    pub fn load(&mut self, version: u64, items: &[RosterItem]) {
        self.version = version;
        self.contacts = Some(
            items
                .iter()
                .map(|i| (i.jid.clone(), i.subscription))
                .collect(),
        );
    }
}
