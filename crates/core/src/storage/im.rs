//! Storage for the instant-messaging core (RFC 6121 roster and
//! subscriptions, XEP-0191 blocking, XEP-0054 vCard, XEP-0049 private XML,
//! XEP-0012 last activity). Each concern is its own trait; XML payloads are
//! stored as serialized strings and parsed back by the module that owns
//! them.

use super::StorageResult;
use async_trait::async_trait;
use starling_proto::BareJid;

/// The subscription state of a roster item (RFC 6121 §2.1.2.5), without the
/// pending flags, which are separate fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subscription {
    /// No subscription either way.
    None,
    /// The user is subscribed to the contact's presence.
    To,
    /// The contact is subscribed to the user's presence.
    From,
    /// Both.
    Both,
}

impl Subscription {
    /// The attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Subscription::None => "none",
            Subscription::To => "to",
            Subscription::From => "from",
            Subscription::Both => "both",
        }
    }

    /// Parses the attribute value (not "remove").
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Subscription::None,
            "to" => Subscription::To,
            "from" => Subscription::From,
            "both" => Subscription::Both,
            _ => return None,
        })
    }

    /// The user receives the contact's presence.
    pub fn has_to(self) -> bool {
        matches!(self, Subscription::To | Subscription::Both)
    }

    /// The contact receives the user's presence.
    pub fn has_from(self) -> bool {
        matches!(self, Subscription::From | Subscription::Both)
    }
}

/// One roster item with its full subscription state (RFC 6121 §2.1.2 and
/// Appendix A: "None + Pending Out" is `subscription: None, ask: true`, and
/// so on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RosterItem {
    /// The contact's bare JID.
    pub jid: BareJid,
    /// The user-chosen name.
    pub name: Option<String>,
    /// The subscription state.
    pub subscription: Subscription,
    /// Pending out: the user asked to subscribe and waits for an answer
    /// (`ask='subscribe'`).
    pub ask: bool,
    /// Pending in: the contact asked to subscribe and waits for the user.
    pub pending_in: bool,
    /// Pre-approved: the user approved a subscription request not yet made
    /// (RFC 6121 §3.4).
    pub approved: bool,
    /// Groups, unique, in the order the client gave them.
    pub groups: Vec<String>,
}

impl RosterItem {
    /// A fresh item with no subscription.
    pub fn new(jid: BareJid) -> Self {
        RosterItem {
            jid,
            name: None,
            subscription: Subscription::None,
            ask: false,
            pending_in: false,
            approved: false,
            groups: Vec::new(),
        }
    }
}

/// A change of a roster since a version (XEP-0237 §4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RosterChange {
    /// The item was added or changed.
    Updated(RosterItem),
    /// The item was removed.
    Removed(BareJid),
}

/// Rosters with per-owner versions (XEP-0237). Every change of an owner's
/// roster increments that owner's version; removed items leave a tombstone
/// so that `changes_since` can report them.
#[async_trait]
pub trait RosterStore: Send + Sync + 'static {
    /// The whole roster (tombstones excluded) and its current version.
    async fn get_roster(&self, owner: &BareJid) -> StorageResult<(u64, Vec<RosterItem>)>;
    /// One item.
    async fn get_item(
        &self,
        owner: &BareJid,
        contact: &BareJid,
    ) -> StorageResult<Option<RosterItem>>;
    /// `contact`'s item in the roster of each of `owners` that has one:
    /// (owner, item). The access checks of many owners' nodes for one
    /// reader (PEP last items at login) in a few queries. The default asks
    /// [`RosterStore::get_item`] per owner.
    async fn items_for_contact(
        &self,
        owners: &[BareJid],
        contact: &BareJid,
    ) -> StorageResult<Vec<(BareJid, RosterItem)>> {
        let mut out = Vec::new();
        for owner in owners {
            if let Some(item) = self.get_item(owner, contact).await? {
                out.push((owner.clone(), item));
            }
        }
        Ok(out)
    }
    /// Inserts or replaces an item; returns the new roster version.
    async fn put_item(&self, owner: &BareJid, item: &RosterItem) -> StorageResult<u64>;
    /// Removes an item; returns the new version, or `None` if it was absent.
    async fn remove_item(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<Option<u64>>;
    /// Changes after `version`, oldest first, and the current version;
    /// `None` when `version` is unknown (newer than current).
    async fn changes_since(
        &self,
        owner: &BareJid,
        version: u64,
    ) -> StorageResult<Option<(u64, Vec<RosterChange>)>>;
    /// Number of items (tombstones excluded).
    async fn count(&self, owner: &BareJid) -> StorageResult<u64>;
    /// Subscription requests received while the user had no available
    /// resource (RFC 6121 §3.1.3), as serialized presence stanzas, oldest
    /// first.
    async fn pending_requests(&self, owner: &BareJid) -> StorageResult<Vec<(BareJid, String)>>;
    /// Whether a subscription request from `contact` to `owner` is
    /// pending: one keyed lookup, where [`RosterStore::pending_requests`]
    /// reads them all (every subscription change asks this).
    async fn has_pending_request(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<bool> {
        Ok(self
            .pending_requests(owner)
            .await?
            .iter()
            .any(|(j, _)| j == contact))
    }
    /// Stores (or replaces) a pending subscription request.
    async fn put_pending_request(
        &self,
        owner: &BareJid,
        from: &BareJid,
        stanza: &str,
    ) -> StorageResult<()>;
    /// Removes a pending subscription request.
    async fn remove_pending_request(&self, owner: &BareJid, from: &BareJid) -> StorageResult<()>;
    /// Deletes everything stored for `owner`.
    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
}

/// Small per-user XML documents: vCard (XEP-0054) under kind "vcard" and
/// key "", private XML (XEP-0049) under kind "private" keyed by
/// `{namespace}name`. Values are serialized XML.
#[async_trait]
pub trait UserDataStore: Send + Sync + 'static {
    /// A document.
    async fn get(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<Option<String>>;
    /// Stores (or replaces) a document.
    async fn set(&self, owner: &BareJid, kind: &str, key: &str, value: &str) -> StorageResult<()>;
    /// Deletes a document.
    async fn delete(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<()>;
    /// Deletes every document of `owner`.
    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
}
