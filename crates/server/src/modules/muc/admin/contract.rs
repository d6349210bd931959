//! The operations of the rooms endpoints (`api.rs`) on the service
//! ([`RoomAdmin`], implemented by `MucAdmin` in `mod.rs`) and their types,
//! which the endpoints serialize as they are.

use serde::Serialize;
use starling_core::async_trait;
use starling_proto::BareJid;

/// What the group-chat module offers the admin API.
#[async_trait]
pub trait RoomAdmin: Send + Sync + 'static {
    /// The service's domains (its subdomain of every served domain),
    /// sorted.
    fn services(&self) -> Vec<String>;
    /// Whether `domain` is the service under a served domain.
    fn is_service(&self, domain: &str) -> bool;
    /// Rooms of `service` by name after room name `after`, at most
    /// `limit`: those live on this node and the stored (persistent) ones.
    async fn list(
        &self,
        service: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RoomSummary>, RoomError>;
    /// One room (`None`: neither live on this node nor stored).
    async fn show(&self, room: &BareJid) -> Result<Option<RoomDetails>, RoomError>;
    /// Applies a change through the room's rules.
    async fn change(&self, room: &BareJid, change: RoomChange) -> Result<Applied, RoomError>;
}

/// A room in a list.
#[derive(Clone, Debug, Serialize)]
pub struct RoomSummary {
    pub jid: String,
    pub name: String,
    pub persistent: bool,
    pub public: bool,
    pub members_only: bool,
    /// Not enterable until its owner configures it (XEP-0045 §10.1).
    pub locked: bool,
    /// Occupants now (0 for a room not loaded on this node).
    pub occupants: usize,
    /// Loaded on this node.
    pub loaded: bool,
    /// The cluster node that runs it (this node on a single node).
    pub node: u8,
}

/// One affiliation row.
#[derive(Clone, Debug, Serialize)]
pub struct AffiliationEntry {
    pub jid: String,
    /// The nickname registered with it (§7.10).
    pub nick: Option<String>,
    pub reason: Option<String>,
}

/// The affiliation lists (§5.2).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Affiliations {
    pub owner: Vec<AffiliationEntry>,
    pub admin: Vec<AffiliationEntry>,
    pub member: Vec<AffiliationEntry>,
    pub outcast: Vec<AffiliationEntry>,
}

/// An occupant of a loaded room.
#[derive(Clone, Debug, Serialize)]
pub struct OccupantEntry {
    pub nick: String,
    pub role: String,
    pub affiliation: String,
    /// The real JID (the session that joined last).
    pub jid: String,
    /// Every session in the room under this nick.
    pub sessions: Vec<String>,
}

/// A room's configuration summary, affiliations and occupants.
#[derive(Clone, Debug, Serialize)]
pub struct RoomDetails {
    pub jid: String,
    pub loaded: bool,
    pub node: u8,
    pub name: String,
    pub description: String,
    pub subject: String,
    pub persistent: bool,
    pub public: bool,
    pub members_only: bool,
    pub moderated: bool,
    pub password_protected: bool,
    /// Messages archived (`muc#roomconfig_enablelogging`).
    pub logging: bool,
    pub locked: bool,
    pub max_users: u32,
    /// Who sees real JIDs: `moderators` (semi-anonymous) or `anyone`.
    pub whois: String,
    pub created_at: Option<String>,
    pub affiliations: Affiliations,
    /// Empty unless the room is loaded on this node.
    pub occupants: Vec<OccupantEntry>,
}

/// A change to a room, checked by the API before it is sent.
#[derive(Clone, Debug)]
pub enum RoomChange {
    /// A new room owned by `owner`, unlocked, nobody in it.
    Create {
        owner: BareJid,
        name: String,
        persistent: bool,
        public: Option<bool>,
        members_only: Option<bool>,
    },
    /// §10.9, with the reason occupants are given.
    Destroy { reason: Option<String> },
    /// §9–§10: `affiliation` is owner, admin, member, outcast or none.
    Affiliation {
        jid: BareJid,
        affiliation: &'static str,
        reason: Option<String>,
    },
    /// A groupchat message from the room itself.
    Message { body: String },
}

/// What became of a change.
#[derive(Debug)]
pub enum Applied {
    /// The room applied it (`id`: the message's id, for a message).
    Done { id: Option<String> },
    /// The room runs on another cluster node, which got the request.
    Forwarded { node: u8 },
}

/// Why a room operation failed.
#[derive(Debug)]
pub enum RoomError {
    /// 404: no such room.
    NotFound(String),
    /// 409: the room refuses it in its state (it exists; its last owner).
    Conflict(String),
    /// 400: the room or the service refuses the values.
    Invalid(String),
    /// 503: storage failed, or the room did not answer.
    Unavailable(String),
}
