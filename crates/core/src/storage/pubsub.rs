//! Publish-subscribe (XEP-0060) nodes and their items, for PEP (XEP-0163:
//! the service is an account's bare JID) and for the pubsub service (the
//! service is its domain, `pubsub.example.org`). One set of tables serves
//! both: `service` is a string, the node's configuration is the module's
//! own serialization (versioned by it), items are stored as the XML of
//! their payload.

use super::StorageResult;
use async_trait::async_trait;
use starling_proto::BareJid;

/// A stored node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredNode {
    /// The service: an account's bare JID (PEP) or a pubsub service's
    /// domain.
    pub service: String,
    /// The node's name (NodeID, XEP-0060 §12.13).
    pub node: String,
    /// The node configuration, as the pubsub module serializes it.
    pub config: String,
    /// When the node was created, milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// A published item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredItem {
    /// The ItemID (unique within its node).
    pub id: String,
    /// Who published it (a bare or full JID, as the module chooses).
    pub publisher: String,
    /// The payload: the XML of the item's child element (may be empty for
    /// notification-only nodes).
    pub payload: String,
    /// The module's publication order: newer publications have larger
    /// values (microseconds since the Unix epoch, made unique by the
    /// module). Republishing an item id replaces the item and gives it the
    /// new value.
    pub seq: i64,
}

/// A subscription to a node (XEP-0060 §6.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubsubSubscription {
    /// The subscribed JID (bare or full), as given by the subscriber.
    pub jid: String,
    /// The subscription id (§6.1.6: several subscriptions of one JID).
    pub subid: String,
    /// `subscribed`, `pending` or `unconfigured`.
    pub state: String,
    /// The subscription options, as the pubsub module serializes them
    /// (empty: the defaults).
    pub options: String,
}

/// Pubsub nodes, items, subscriptions and affiliations.
///
/// "Newest first" is by [`StoredItem::seq`], descending; should two items
/// of a node share a seq, the larger id counts as the newer (a
/// deterministic order, nothing more). Writes that require the node
/// ("the node must exist") fail with [`super::StorageError::Backend`]
/// when it does not, and write nothing; the other writes to a missing
/// node find nothing to change (false, 0 or nothing removed).
#[async_trait]
pub trait PubsubStore: Send + Sync + 'static {
    /// The node, if it exists.
    async fn node(&self, service: &str, node: &str) -> StorageResult<Option<StoredNode>>;
    /// Creates a node. Fails with [`super::StorageError::Conflict`] if it
    /// exists.
    async fn create_node(&self, node: &StoredNode) -> StorageResult<()>;
    /// Replaces a node's configuration. Returns false if there is no such
    /// node.
    async fn set_node_config(&self, service: &str, node: &str, config: &str)
        -> StorageResult<bool>;
    /// Deletes a node with its items, subscriptions and affiliations.
    /// Returns false if there was no such node.
    async fn delete_node(&self, service: &str, node: &str) -> StorageResult<bool>;
    /// The nodes of a service, by name.
    async fn nodes(&self, service: &str) -> StorageResult<Vec<StoredNode>>;

    /// Stores an item (replacing one with the same id) and, in the same
    /// transaction, keeps only the `max_items` newest (by `seq`) if given.
    /// Returns the ids of the items removed to make room, oldest first
    /// (never the replaced item: replacing is not removing). `Some(0)`
    /// keeps nothing, the new item included (its id is then among those
    /// returned). The node must exist (else an error).
    async fn publish(
        &self,
        service: &str,
        node: &str,
        item: &StoredItem,
        max_items: Option<u32>,
    ) -> StorageResult<Vec<String>>;
    /// The node's items, newest first, at most `max` if given.
    async fn items(
        &self,
        service: &str,
        node: &str,
        max: Option<u32>,
    ) -> StorageResult<Vec<StoredItem>>;
    /// The node's items with these ids (those that exist), newest first,
    /// each once (whatever repeats `ids` holds).
    async fn items_by_id(
        &self,
        service: &str,
        node: &str,
        ids: &[String],
    ) -> StorageResult<Vec<StoredItem>>;
    /// The newest item of every node of the service that has one: (node,
    /// item), by node name. One query (last items sent at login).
    async fn last_items(&self, service: &str) -> StorageResult<Vec<(String, StoredItem)>>;
    /// The newest item of every node of each of `services` that has one,
    /// with its node: (node, item), by service then node name. What an
    /// account that comes online is sent from all its contacts' PEP
    /// services, in a few queries rather than two per contact. The default
    /// asks [`PubsubStore::nodes`] and [`PubsubStore::last_items`] per
    /// service.
    async fn last_items_of(
        &self,
        services: &[String],
    ) -> StorageResult<Vec<(StoredNode, StoredItem)>> {
        let mut out = Vec::new();
        for service in services {
            let nodes = self.nodes(service).await?;
            for (node, item) in self.last_items(service).await? {
                if let Some(n) = nodes.iter().find(|n| n.node == node) {
                    out.push((n.clone(), item));
                }
            }
        }
        Ok(out)
    }
    /// Bytes of payload (UTF-8) the service's items hold over all its
    /// nodes, leaving out item `except` (node, item id): what a
    /// per-account quota counts before a publication that would replace
    /// that item.
    async fn stored_bytes(&self, service: &str, except: Option<(&str, &str)>)
        -> StorageResult<u64>;
    /// Bytes of payload the items of the service's nodes that `owner` (a
    /// bare JID) has the `owner` affiliation of hold, leaving out item
    /// `except` (node, item id): a per-owner quota of a pubsub service.
    async fn owned_bytes(
        &self,
        service: &str,
        owner: &str,
        except: Option<(&str, &str)>,
    ) -> StorageResult<u64>;
    /// Deletes one item. Returns false if it did not exist.
    async fn retract(&self, service: &str, node: &str, id: &str) -> StorageResult<bool>;
    /// Deletes every item of the node. Returns how many there were.
    async fn purge(&self, service: &str, node: &str) -> StorageResult<u64>;
    /// Keeps only the `max` newest items of the node (after its
    /// `max_items` was lowered). Returns the ids removed, oldest first
    /// (none if there is no such node).
    async fn trim(&self, service: &str, node: &str, max: u32) -> StorageResult<Vec<String>>;

    /// The node's subscriptions, by JID then subid.
    async fn subscriptions(
        &self,
        service: &str,
        node: &str,
    ) -> StorageResult<Vec<PubsubSubscription>>;
    /// Stores a subscription (replacing the one with the same jid and
    /// subid). The node must exist (else an error).
    async fn set_subscription(
        &self,
        service: &str,
        node: &str,
        sub: &PubsubSubscription,
    ) -> StorageResult<()>;
    /// Removes `jid`'s subscription `subid` (all of `jid`'s if `None`).
    /// Returns how many were removed.
    async fn remove_subscription(
        &self,
        service: &str,
        node: &str,
        jid: &str,
        subid: Option<&str>,
    ) -> StorageResult<u64>;
    /// Every subscription `jid` (compared as stored) has on the service:
    /// (node, subscription), by node.
    async fn subscriptions_of(
        &self,
        service: &str,
        jid: &str,
    ) -> StorageResult<Vec<(String, PubsubSubscription)>>;
    /// Every subscription an account holds on the service, with its bare
    /// JID `jid` or a full JID `jid/…` (compared as bytes, as in
    /// [`PubsubStore::remove_user`]): (node, subscription), by node, then
    /// JID and subid (XEP-0060 §5.6: all JIDs matching the requester's
    /// bare JID).
    async fn subscriptions_of_account(
        &self,
        service: &str,
        jid: &BareJid,
    ) -> StorageResult<Vec<(String, PubsubSubscription)>>;

    /// The node's affiliations (XEP-0060 §4.1): (jid, affiliation), by
    /// JID. The owner is stored like the others.
    async fn affiliations(&self, service: &str, node: &str)
        -> StorageResult<Vec<(String, String)>>;
    /// Sets `jid`'s affiliation (`owner`, `publisher`, `publish-only`,
    /// `member`, `outcast`); `none` deletes it. The node must exist (else
    /// an error, `none` included).
    async fn set_affiliation(
        &self,
        service: &str,
        node: &str,
        jid: &str,
        affiliation: &str,
    ) -> StorageResult<()>;
    /// Every affiliation `jid` has on the service: (node, affiliation),
    /// by node.
    async fn affiliations_of(
        &self,
        service: &str,
        jid: &str,
    ) -> StorageResult<Vec<(String, String)>>;

    /// Account deletion: the account's PEP service (every node whose
    /// service is `jid`, with their items, subscriptions and
    /// affiliations), and the subscriptions and affiliations `jid` (bare,
    /// or full with its resource) holds on any other service: the rows
    /// whose JID is `jid` itself or starts with `jid/`, compared as bytes
    /// (not as a pattern: `%` and `_` in a JID are themselves).
    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()>;
}
