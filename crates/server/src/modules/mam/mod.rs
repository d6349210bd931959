//! Message Archive Management (XEP-0313 `urn:xmpp:mam:2` and `#extended`),
//! with Result Set Management (XEP-0059), stanza ids (XEP-0359), archiving
//! preferences (XEP-0441) and retraction tombstones (XEP-0424).
//!
//! What is archived (XEP-0313 §5.1.1): messages of type `chat` or `normal`
//! that carry a body, a `<store/>` hint, a XEP-0424 retraction, a XEP-0184
//! receipt, a XEP-0333 marker or an OMEMO payload — so that every device
//! that catches up from the archive converges on the same conversation.
//! Not archived: chat-state-only messages, `no-store` / `no-permanent-store`
//! hints (XEP-0334), errors, headlines, groupchat, carbons and MAM results.
//!
//! - Outgoing copies are archived when the user sends (`user_send`, after
//!   blocking), incoming ones when the router accepts a message for a local
//!   account (`inbound`, after blocking), each with its own id. The incoming
//!   copy gets `<stanza-id by='user@domain' id='…'/>` before delivery;
//!   stanza ids claiming to be by the recipient are removed first (XEP-0359
//!   §5, anti-spoofing). Messages to oneself are archived once, as incoming.
//! - Ids: [`ArchiveId`] — the node's clock in µs << 8 | node id, strictly
//!   increasing per node (a clock step backwards never repeats an id),
//!   unique across a deployment whose nodes have distinct `server.node_id`.
//!   Clients see them as 13 base-32 digits whose string order is time
//!   order. They are time-ordered rather than unpredictable (XEP-0313 §3.1
//!   asks for unpredictable ids): only the owner can query an archive, so
//!   guessing an id reveals nothing.
//! - Writes go through a write-behind queue ([`crate::modules::common::write_behind`]);
//!   queries flush it first, so a client always finds what it just sent.
//! - Queries (§4): form fields `with` (bare or full), `start`, `end`,
//!   `before-id`, `after-id`, `ids`; RSM `max`, `after`, `before` (empty:
//!   last page), `<flip-page/>`; `<fin complete='true'>` when the page
//!   reaches the end in the paging direction; RSM `max=0` returns the
//!   count. Unknown ids → `item-not-found`; unknown fields or RSM `index`
//!   → `feature-not-implemented`; malformed forms or dates → `bad-request`;
//!   someone else's archive → `forbidden`. Query form (get), metadata
//!   (§6, `#extended`) and preferences (XEP-0441: default always/roster/
//!   never plus always/never lists) are answered. Parsing and rendering
//!   are [`crate::modules::common::archive_query`]'s, shared with rooms' archives.
//! - Retraction (XEP-0424): when the author retracts, the original in the
//!   author's archive and in the recipient's is replaced by a tombstone
//!   `<retracted id='(retraction id)' stamp='…'/>` keeping the original's
//!   attributes (§5, feature `#tombstone`); the retraction itself is
//!   archived. A retraction is matched only against messages from the same
//!   bare JID (§6). Retracting a message someone else wrote is refused with
//!   `<forbidden/>`.
//! - Retention: a served domain's `archive_retention_days` setting
//!   (docs/domains.md), else `retention_days` / `domain_retention_days`, purge older
//!   messages hourly; `starling archive purge` removes one user's archive.
//!
//! - The sender's archive id rides in the stanza while the carbons module
//!   copies it (sent carbons carry `<stanza-id by='sender'/>`, §3.1) and is
//!   stripped before routing (`user_send` 90), together with any such id a
//!   client put there itself.
//!
//! - Offline recipients: the incoming copy of a message that goes to the
//!   offline store is committed in the offline store's transaction
//!   (`offline_message` 40), so a message delivered from offline storage
//!   is always in the recipient's archive too.
//!
//! Hooks: `user_send` (45, 90), `inbound` (20), `offline_message` (40),
//! `shutdown`, `durability`; announces each kept copy on `archived` (the
//! inbox follows it); own-account iq handlers
//! `{urn:xmpp:mam:2}query|prefs|metadata` (answered in the requesting
//! session; other accounts' requests get `forbidden`); disco features
//! `mam:2`, `#extended` and `sid:0` on the account and the server (§7),
//! retraction features on the account.
//! Storage: `ArchiveStore`, roster (for the `roster` default).
//! Config: `[modules.mam]` ([`MamConfig`]), `server.node_id`.

pub mod cli;

use crate::modules::common::archive_query::{self, NS_MAM_EXTENDED};
use crate::modules::common::write_behind::{BatchSink, Claim, WriteBehind, WriteBehindConfig};
use starling_core::disco::Scopes;
use starling_core::hooks::{
    Archived, BoundHandler, DurabilityHandler, HookRegistry, InboundHandler, IqHandler, IqResponse,
    IqScope, OfflineCompanions, OfflineMessageHandler, OwnIqHandler, ShutdownHandler,
    StartedHandler, UserSendHandler,
};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{
    ArchiveId, ArchiveIds, ArchivePrefs, ArchiveRecord, ArchiveStore, PrefsDefault, Storage,
    StorageResult, FLAG_BODY,
};
use starling_core::{async_trait, Env, Flow, HookResult, Metrics, Pressure, SessionCtx};
use starling_proto::datetime::xep0082_datetime;
use starling_proto::mam::{classify, origin_id, Kind, NS_MAM, NS_RETRACT, NS_SID};
use starling_proto::{
    ns, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `[modules.mam]`: message archive (XEP-0313, XEP-0359, XEP-0441,
/// XEP-0424 tombstones).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MamConfig {
    /// Run the module.
    pub enabled: bool,
    /// Archiving default for users who set no preference: "always",
    /// "roster" or "never".
    pub default_mode: String,
    /// Page size when a query gives no RSM `<max/>`.
    pub default_page_size: u32,
    /// Largest page a query may ask for.
    pub max_page_size: u32,
    /// Days messages are kept (0: forever).
    pub retention_days: u32,
    /// Per-domain retention overriding `retention_days`.
    pub domain_retention_days: std::collections::BTreeMap<String, u32>,
    /// Write-behind queue: records waiting at most before senders wait.
    pub queue_capacity: usize,
    /// Write-behind queue: MiB the waiting records may hold at most
    /// before senders wait (half of it raises the back-pressure).
    pub queue_max_mib: usize,
    /// Write-behind queue: records per database transaction at most.
    pub batch_size: usize,
    /// Write-behind queue: milliseconds a small batch waits for more.
    pub batch_delay_ms: u64,
}

impl Default for MamConfig {
    fn default() -> Self {
        MamConfig {
            enabled: true,
            default_mode: "always".into(),
            default_page_size: 50,
            max_page_size: 250,
            retention_days: 0,
            domain_retention_days: Default::default(),
            queue_capacity: 100_000,
            queue_max_mib: 64,
            batch_size: 20_000,
            batch_delay_ms: 500,
        }
    }
}

const NAME: &str = "mam";
const NS_RETRACT_TOMBSTONE: &str = "urn:xmpp:message-retract:1#tombstone";
const PREFS_CACHE_MAX: usize = 100_000;
const PREFS_TTL: Duration = Duration::from_secs(60);

/// The archive module; shared with the inbox module.
pub struct Mam {
    ids: Arc<ArchiveIds>,
    store: Arc<dyn ArchiveStore>,
    queue: WriteBehind<ArchiveRecord>,
    default_mode: PrefsDefault,
    default_page: u32,
    max_page: u32,
    /// Preferences by bare JID, with when they were loaded.
    prefs_cache: Mutex<HashMap<String, (std::time::Instant, Arc<ArchivePrefs>)>>,
    retention: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// `retention_days` and `domain_retention_days`, for the retention
    /// task (a domain's own setting overrides both).
    retention_days: u32,
    domain_retention_days: std::collections::BTreeMap<String, u32>,
}

struct Sink(Arc<dyn ArchiveStore>);

#[async_trait]
impl BatchSink<ArchiveRecord> for Sink {
    async fn write(&self, batch: &[ArchiveRecord]) -> StorageResult<()> {
        self.0.append(batch).await
    }
}

/// The write-behind sizing of `[modules.mam]`.
fn queue_config(cfg: &MamConfig) -> WriteBehindConfig {
    WriteBehindConfig {
        capacity: cfg.queue_capacity,
        max_bytes: cfg.queue_max_mib.saturating_mul(1 << 20),
        max_batch: cfg.batch_size,
        max_delay: Duration::from_millis(cfg.batch_delay_ms),
    }
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn err(c: StanzaErrorCondition, text: &str) -> StanzaError {
    StanzaError::new(c).with_text(text)
}

impl Mam {
    /// Registers the module and starts its writer (and the retention task
    /// if configured). Returns it for the inbox module.
    pub async fn register(
        cfg: &MamConfig,
        domains: &[String],
        ids: Arc<ArchiveIds>,
        storage: &Storage,
        metrics: &Metrics,
        pressure: &Arc<Pressure>,
        reg: &mut HookRegistry,
    ) -> Arc<Mam> {
        let store = storage.archive.clone();
        let queue = WriteBehind::spawn(
            "archive",
            Arc::new(Sink(store.clone())),
            queue_config(cfg),
            metrics.write_behind.queue("archive"),
            pressure.clone(),
        );
        let m = Arc::new(Mam {
            ids,
            store: store.clone(),
            queue,
            default_mode: PrefsDefault::parse(&cfg.default_mode).unwrap_or(PrefsDefault::Always),
            default_page: cfg.default_page_size,
            max_page: cfg.max_page_size,
            prefs_cache: Mutex::new(HashMap::new()),
            retention: Mutex::new(None),
            retention_days: cfg.retention_days,
            domain_retention_days: cfg.domain_retention_days.clone(),
        });
        // Retention per served domain, stored domains included: started
        // with the environment (Mam::started), which knows the host set.
        let _ = domains;
        reg.started(m.clone());
        reg.user_send(NAME, 45, m.clone());
        reg.user_send(NAME, 90, Arc::new(StripOwnStanzaId));
        reg.inbound(NAME, 20, m.clone());
        // Before the offline store (50), which commits our row with it.
        reg.offline_message(NAME, 40, m.clone());
        reg.shutdown(NAME, 90, m.clone());
        reg.durability(m.clone());
        reg.cache(NAME, m.clone());
        // XEP-0386 §3.3: the archive's state at the moment of binding.
        reg.bound(NAME, 50, m.clone());
        for name in ["query", "prefs", "metadata"] {
            reg.own_iq(NAME, name, NS_MAM, m.clone());
            reg.iq(
                NAME,
                IqScope::Account,
                name,
                NS_MAM,
                Arc::new(NotYourArchive),
            );
        }
        // §7: on the archiving JID (the account); also on the server,
        // where clients look for it first (as Prosody and ejabberd do).
        reg.disco()
            .feature(Scopes::BOTH, NS_MAM)
            .feature(Scopes::BOTH, NS_MAM_EXTENDED)
            .feature(Scopes::BOTH, NS_SID)
            .feature(IqScope::Account, NS_RETRACT)
            .feature(IqScope::Account, NS_RETRACT_TOMBSTONE);
        m
    }

    /// A new archive id (the node's shared generator).
    pub fn next_id(&self) -> ArchiveId {
        self.ids.next()
    }

    /// Waits until every record queued so far is written.
    pub async fn flush(&self) {
        self.queue.flush().await;
    }

    async fn prefs(&self, env: &Env, owner: &BareJid) -> Arc<ArchivePrefs> {
        let key = owner.as_str();
        // Entries are reloaded after PREFS_TTL: an account deleted and
        // created again elsewhere takes effect within it (preferences
        // changed on another cluster node are invalidated at once, see
        // the CacheHandler below).
        if let Some((at, p)) = self
            .prefs_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            if at.elapsed() < PREFS_TTL {
                return p.clone();
            }
        }
        let p = match env.storage.archive.prefs(owner).await {
            Ok(Some(p)) => p,
            Ok(None) => self.default_prefs(),
            Err(e) => {
                tracing::error!(module = NAME, user = %owner, error = %e, "loading archive preferences failed; using the default");
                self.default_prefs()
            }
        };
        let p = Arc::new(p);
        let mut cache = self.prefs_cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= PREFS_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key.to_owned(), (std::time::Instant::now(), p.clone()));
        p
    }

    fn default_prefs(&self) -> ArchivePrefs {
        ArchivePrefs {
            default: self.default_mode,
            always: Vec::new(),
            never: Vec::new(),
        }
    }

    /// XEP-0441 §4: does `owner` archive messages with `remote`?
    async fn wants(&self, env: &Env, owner: &BareJid, remote: &Jid) -> bool {
        let p = self.prefs(env, owner).await;
        let bare = remote.to_bare();
        let listed = |l: &[String]| l.iter().any(|j| j == bare.as_str() || j == remote.as_str());
        if listed(&p.never) {
            return false;
        }
        if listed(&p.always) {
            return true;
        }
        match p.default {
            PrefsDefault::Always => true,
            PrefsDefault::Never => false,
            PrefsDefault::Roster => {
                bare == *owner
                    || matches!(env.storage.roster.get_item(owner, &bare).await, Ok(Some(_)))
            }
        }
    }

    /// Queues one archived copy (`xml`, serialized before any stanza-id was
    /// added) and tells the [`ArchivedHandler`]s (the inbox).
    #[allow(clippy::too_many_arguments)]
    async fn keep(
        &self,
        env: &Env,
        owner: &BareJid,
        peer: &BareJid,
        remote: &Jid,
        outgoing: bool,
        id: ArchiveId,
        kind: Kind,
        xml: String,
        el: &Element,
    ) {
        self.queue
            .push(ArchiveRecord {
                owner: owner.clone(),
                id,
                with_bare: peer.as_str().to_owned(),
                remote: remote.to_string(),
                outgoing,
                origin_id: origin_id(el),
                flags: if kind == Kind::Instant { FLAG_BODY } else { 0 },
                stanza: xml,
            })
            .await;
        env.hooks
            .archived(
                env,
                &Archived {
                    owner,
                    peer,
                    id,
                    outgoing,
                    kind,
                    element: el,
                    shared: false,
                },
            )
            .await;
    }

    /// XEP-0424: replaces the message `origin` that `author` sent to
    /// (`outgoing`) or received from (`!outgoing`) `peer` in `owner`'s
    /// archive with a tombstone. Returns whether one was found.
    async fn tombstone(
        &self,
        owner: &BareJid,
        peer: &BareJid,
        origin: &str,
        outgoing: bool,
        retraction_id: &str,
    ) -> StorageResult<bool> {
        self.flush().await;
        let Some(m) = self
            .store
            .find_by_origin(owner, peer.as_str(), origin, outgoing)
            .await?
        else {
            return Ok(false);
        };
        let Ok(original) = m.stanza.parse::<Element>() else {
            return Ok(false);
        };
        let mut t = Element::new("message", ns::CLIENT);
        for (k, v) in original.attrs() {
            t.set_attr(k, v);
        }
        t.append_child(
            Element::builder("retracted", NS_RETRACT)
                .attr("id", retraction_id)
                .attr("stamp", xep0082_datetime((now_micros() / 1000) as u128))
                .build(),
        );
        let xml = t.to_string_in("");
        self.store.replace(owner, m.id, &xml).await?;
        Ok(true)
    }

    /// Builds the results of a query for `owner`: the result messages and
    /// the final iq, or an error.
    async fn run_query(
        &self,
        owner: &BareJid,
        requester: &FullJid,
        iq: &Stanza,
    ) -> Result<(Vec<Element>, Element), StanzaError> {
        let q = iq.payload().expect("checked by caller");
        let req = archive_query::parse(q, self.default_page, self.max_page)?;
        self.flush().await;
        archive_query::answer(
            self.store.as_ref(),
            owner,
            requester,
            iq,
            &req,
            NAME,
            |_, stored| stored,
        )
        .await
    }

    async fn metadata(&self, owner: &BareJid) -> Result<Element, StanzaError> {
        self.flush().await;
        match self.store.bounds(owner).await {
            Ok(bounds) => Ok(archive_query::metadata(bounds)),
            Err(e) => {
                tracing::error!(module = NAME, user = %owner, error = %e, "archive metadata failed");
                Err(StanzaErrorCondition::InternalServerError.into())
            }
        }
    }

    async fn prefs_iq(&self, env: &Env, owner: &BareJid, iq: &Stanza) -> IqResponse {
        let p = iq.payload().expect("routed by payload");
        if iq.type_attr() == Some("set") {
            let Some(default) = p.attr("default").and_then(PrefsDefault::parse) else {
                return IqResponse::Error(err(
                    StanzaErrorCondition::BadRequest,
                    "default must be always, roster or never",
                ));
            };
            let list = |name: &str| -> Result<Vec<String>, StanzaError> {
                let mut out = Vec::new();
                if let Some(l) = p.get_child(name, NS_MAM) {
                    for j in l.children().filter(|c| c.is("jid", NS_MAM)) {
                        let jid: Jid = j.text().trim().parse().map_err(|_| {
                            err(
                                StanzaErrorCondition::JidMalformed,
                                "invalid JID in preferences",
                            )
                        })?;
                        out.push(jid.to_string());
                    }
                }
                Ok(out)
            };
            let prefs = match (list("always"), list("never")) {
                (Ok(always), Ok(never)) => ArchivePrefs {
                    default,
                    always,
                    never,
                },
                (Err(e), _) | (_, Err(e)) => return IqResponse::Error(e),
            };
            if let Err(e) = env.storage.archive.set_prefs(owner, &prefs).await {
                tracing::error!(module = NAME, user = %owner, error = %e, "saving archive preferences failed");
                return IqResponse::Error(StanzaErrorCondition::InternalServerError.into());
            }
            self.prefs_cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    owner.as_str().to_owned(),
                    (std::time::Instant::now(), Arc::new(prefs)),
                );
            // Other cluster nodes archive for this account too.
            env.router.invalidate(NAME, owner.as_str());
        }
        let prefs = self.prefs(env, owner).await;
        let list = |name: &str, jids: &[String]| {
            let mut l = Element::new(name, NS_MAM);
            for j in jids {
                l.append_child(Element::builder("jid", NS_MAM).text(j.clone()).build());
            }
            l
        };
        IqResponse::Result(Some(
            Element::builder("prefs", NS_MAM)
                .attr("default", prefs.default.as_str())
                .append(list("always", &prefs.always))
                .append(list("never", &prefs.never))
                .build(),
        ))
    }
}

/// Deletes `domain`'s messages older than `days` days; returns how many.
pub async fn purge_domain(store: &dyn ArchiveStore, domain: &str, days: u32) -> StorageResult<u64> {
    crate::modules::common::archive_query::purge_domain(store, domain, days, NAME).await
}

#[async_trait]
impl UserSendHandler for Mam {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        let me = cx.jid().clone();
        let owner = me.to_bare();
        if stanza.kind() != StanzaKind::Message {
            return Ok(Flow::Continue);
        }
        let Some(to) = stanza.to().cloned() else {
            return Ok(Flow::Continue);
        };
        if to.node().is_none() {
            return Ok(Flow::Continue); // to a server: nothing to archive
        }
        let peer = to.to_bare();
        if peer != owner {
            // Only the server names the sender's archive ids (the sent
            // carbon copies what is left here).
            strip_stanza_ids_by(stanza, &owner);
        }
        let kind = classify(stanza.element());
        if kind == Kind::Skip {
            return Ok(Flow::Continue);
        }
        if let Some(r) = stanza.element().get_child("retract", NS_RETRACT) {
            let target = r.attr("id").unwrap_or("").to_owned();
            let retraction_id = stanza.id().unwrap_or("").to_owned();
            if !target.is_empty() {
                let mine = self
                    .tombstone(&owner, &peer, &target, true, &retraction_id)
                    .await?;
                if !mine {
                    let theirs = self
                        .store
                        .find_by_origin(&owner, peer.as_str(), &target, false)
                        .await?;
                    if theirs.is_some() {
                        cx.reply_error(
                            stanza,
                            err(
                                StanzaErrorCondition::Forbidden,
                                "only the author of a message can retract it (XEP-0424 §6)",
                            ),
                        );
                        return Ok(Flow::Stop);
                    }
                }
            }
        }
        if peer == owner {
            return Ok(Flow::Continue); // archived once, as incoming
        }
        if !self.wants(cx.env, &owner, &to).await {
            return Ok(Flow::Continue);
        }
        let id = self.next_id();
        let xml = stanza.element().to_string_in("");
        // XEP-0313 §3.1: the sender's other devices learn the archive id
        // from the sent carbon (the carbons module copies the stanza after
        // this handler); StripOwnStanzaId removes it again before routing.
        stanza.element_mut().append_child(
            Element::builder("stanza-id", NS_SID)
                .attr("by", owner.as_str())
                .attr("id", id.encode())
                .build(),
        );
        self.keep(
            cx.env,
            &owner,
            &peer,
            &to,
            true,
            id,
            kind,
            xml,
            stanza.element(),
        )
        .await;
        Ok(Flow::Continue)
    }
}

/// Removes `<stanza-id by='{by}'/>` children.
fn strip_stanza_ids_by(stanza: &mut Stanza, by: &BareJid) {
    let claims = |c: &Element| c.is("stanza-id", NS_SID) && c.attr("by") == Some(by.as_str());
    if stanza.element().children().any(claims) {
        stanza
            .element_mut()
            .nodes_mut()
            .retain(|n| n.as_element().is_none_or(|c| !claims(c)));
    }
}

/// Removes stanza ids claiming the sender's own archive from what the
/// sender routes: the recipient may not see ids of an archive it cannot
/// query (XEP-0313 §3.1), and a client cannot plant one either.
struct StripOwnStanzaId;

#[async_trait]
impl UserSendHandler for StripOwnStanzaId {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Message {
            return Ok(Flow::Continue);
        }
        let own = cx.jid().to_bare();
        if stanza.to().is_none_or(|t| t.to_bare() != own) {
            strip_stanza_ids_by(stanza, &own);
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl InboundHandler for Mam {
    async fn inbound(&self, env: &Env, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Message {
            return Ok(Flow::Continue);
        }
        let Some(to) = stanza.to() else {
            return Ok(Flow::Continue);
        };
        let owner = to.to_bare();
        // XEP-0359 §5: nobody else may claim to be the archive of the recipient.
        strip_stanza_ids_by(stanza, &owner);
        let kind = classify(stanza.element());
        if kind == Kind::Skip {
            return Ok(Flow::Continue);
        }
        let Some(from) = stanza.from().cloned() else {
            return Ok(Flow::Continue);
        };
        let peer = from.to_bare();
        // Only archive for accounts that exist (the router bounces the rest).
        if !env.sessions.has_resources(&owner) && !env.storage.accounts.exists(&owner).await? {
            return Ok(Flow::Continue);
        }
        if let Some(r) = stanza.element().get_child("retract", NS_RETRACT) {
            let target = r.attr("id").unwrap_or("").to_owned();
            let retraction_id = stanza.id().unwrap_or("").to_owned();
            if !target.is_empty() && peer != owner {
                self.tombstone(&owner, &peer, &target, false, &retraction_id)
                    .await?;
            }
        }
        if !self.wants(env, &owner, &from).await {
            return Ok(Flow::Continue);
        }
        let id = self.next_id();
        stanza.element_mut().append_child(
            Element::builder("stanza-id", NS_SID)
                .attr("by", owner.as_str())
                .attr("id", id.encode())
                .build(),
        );
        let xml = stanza.element().to_string_in("");
        self.keep(
            env,
            &owner,
            &peer,
            &from,
            false,
            id,
            kind,
            xml,
            stanza.element(),
        )
        .await;
        Ok(Flow::Continue)
    }
}

/// A message for an offline recipient: its incoming copy (queued by
/// `inbound` moments ago) is taken back out of the write-behind queue and
/// handed to the offline store, which commits it in the same transaction
/// as the stored message. If the writer already has it, the offline store
/// waits until it is committed. Either way, a message stored offline is in
/// the recipient's archive too (docs/durability.md).
/// Stream-management acks cover a client's messages only once their
/// archive rows are committed (docs/durability.md).
#[async_trait]
impl DurabilityHandler for Mam {
    async fn durable(&self, _env: &Env) {
        self.queue.committed_all().await;
    }
}

#[async_trait]
impl OfflineMessageHandler for Mam {
    async fn offline_message(
        &self,
        _env: &Env,
        stanza: &Stanza,
        companions: &mut OfflineCompanions,
    ) -> HookResult {
        let Some(owner) = stanza.to().map(Jid::to_bare) else {
            return Ok(Flow::Continue);
        };
        // `inbound` removed every other id claiming this archive, so this
        // one is ours.
        let Some(id) = stanza
            .element()
            .children()
            .find(|c| c.is("stanza-id", NS_SID) && c.attr("by") == Some(owner.as_str()))
            .and_then(|c| ArchiveId::decode(c.attr("id")?))
        else {
            return Ok(Flow::Continue); // not archived
        };
        match self.queue.claim(|r| r.id == id && r.owner == owner) {
            Claim::Taken(record) => companions.archive.push(record),
            Claim::NotQueued(ticket) => self.queue.committed(ticket).await,
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl BoundHandler for Mam {
    async fn bound(&self, cx: &mut SessionCtx<'_>) -> HookResult {
        let owner = cx.jid().to_bare();
        if let Ok(md) = self.metadata(&owner).await {
            cx.send(md);
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl OwnIqHandler for Mam {
    async fn own_iq(&self, cx: &mut SessionCtx<'_>, iq: &Stanza) -> IqResponse {
        let me = cx.jid().clone();
        let owner = me.to_bare();
        let env = cx.env;
        let p = iq.payload().expect("dispatched by payload");
        match (p.name(), iq.type_attr()) {
            ("query", Some("get")) => IqResponse::Result(Some(archive_query::query_form())),
            // Results go straight to this session: large pages never pass
            // through a mailbox.
            ("query", Some("set")) => match self.run_query(&owner, &me, iq).await {
                Ok((results, fin)) => {
                    for r in results {
                        cx.send(r);
                    }
                    cx.send(fin);
                    IqResponse::Handled
                }
                Err(e) => IqResponse::Error(e),
            },
            ("metadata", Some("get")) => match self.metadata(&owner).await {
                Ok(md) => IqResponse::Result(Some(md)),
                Err(e) => IqResponse::Error(e),
            },
            ("prefs", Some("get" | "set")) => self.prefs_iq(env, &owner, iq).await,
            _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
        }
    }
}

/// Requests for someone else's archive (own ones are answered in-session).
struct NotYourArchive;

#[async_trait]
impl IqHandler for NotYourArchive {
    async fn handle_iq(&self, _env: &Env, _scope: IqScope, _iq: &Stanza) -> IqResponse {
        IqResponse::Error(err(
            StanzaErrorCondition::Forbidden,
            "only the owner of an archive can use it",
        ))
    }
}

impl StartedHandler for Mam {
    fn started(&self, env: &Arc<Env>) {
        let global = self.retention_days;
        let per_domain = self.domain_retention_days.clone();
        *self.retention.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(tokio::spawn(archive_query::retention_task_for_hosts(
                self.store.clone(),
                Arc::downgrade(env),
                move |d| per_domain.get(d).copied().unwrap_or(global),
                NAME,
            )));
    }
}

#[async_trait]
impl ShutdownHandler for Mam {
    async fn shutdown(&self, _env: &Env) {
        if let Some(t) = self
            .retention
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.abort();
        }
        self.queue.close().await;
    }
}

impl Module for Mam {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0313 message archive with XEP-0359 stanza ids, XEP-0441 preferences, XEP-0424 retraction tombstones";
    type Config = MamConfig;
    const STORAGE: &'static [&'static str] = &["archive", "roster"];

    fn enabled(cfg: &MamConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &MamConfig, domains: &[String]) -> Result<(), ConfigProblem> {
        if PrefsDefault::parse(&cfg.default_mode).is_none() {
            return Err(ConfigProblem::new(
                "default_mode",
                format!(
                    "{:?} is not one of \"always\", \"roster\", \"never\"",
                    cfg.default_mode
                ),
            ));
        }
        if cfg.default_page_size == 0 || cfg.default_page_size > cfg.max_page_size {
            return Err(ConfigProblem::new(
                "default_page_size",
                "must be at least 1 and at most max_page_size",
            ));
        }
        if cfg.queue_capacity == 0 || cfg.batch_size == 0 || cfg.queue_max_mib == 0 {
            return Err(ConfigProblem::new(
                "queue_capacity",
                "queue_capacity, queue_max_mib and batch_size must be at least 1",
            ));
        }
        for d in cfg.domain_retention_days.keys() {
            if !domains.iter().any(|x| x == d) {
                return Err(ConfigProblem::new(
                    "domain_retention_days",
                    format!("{d:?} is not one of server.domains"),
                ));
            }
        }
        Ok(())
    }

    async fn start(cfg: &MamConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Mam::register(
            cfg,
            ctx.domains,
            ctx.archive_ids.clone(),
            ctx.storage,
            ctx.metrics,
            ctx.pressure,
            reg,
        )
        .await;
    }
}

/// A cluster node changed an account's archive preferences.
impl starling_core::hooks::CacheHandler for Mam {
    fn invalidate(&self, key: &str) {
        self.prefs_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(xml: &str) -> Element {
        xml.parse().unwrap()
    }

    #[test]
    fn what_is_archived() {
        let c = |x: &str| classify(&el(x));
        assert_eq!(
            c("<message xmlns='jabber:client' type='chat'><body>hi</body></message>"),
            Kind::Instant
        );
        assert_eq!(
            c("<message xmlns='jabber:client'><body>hi</body></message>"),
            Kind::Instant
        );
        assert_eq!(
            c("<message xmlns='jabber:client' type='chat'><body>fixed</body><replace xmlns='urn:xmpp:message-correct:0' id='a'/></message>"),
            Kind::Correction
        );
        assert_eq!(c("<message xmlns='jabber:client' type='chat'><received xmlns='urn:xmpp:receipts' id='a'/></message>"), Kind::Other);
        assert_eq!(c("<message xmlns='jabber:client' type='chat'><displayed xmlns='urn:xmpp:chat-markers:0' id='a'/></message>"), Kind::Other);
        assert_eq!(
            c("<message xmlns='jabber:client' type='chat'><retract xmlns='urn:xmpp:message-retract:1' id='a'/><body>fallback</body></message>"),
            Kind::Other
        );
        assert_eq!(c("<message xmlns='jabber:client' type='chat'><store xmlns='urn:xmpp:hints'/></message>"), Kind::Other);
        // XEP-0334 and the rest.
        assert_eq!(c("<message xmlns='jabber:client' type='chat'><body>x</body><no-store xmlns='urn:xmpp:hints'/></message>"), Kind::Skip);
        assert_eq!(c("<message xmlns='jabber:client' type='chat'><body>x</body><no-permanent-store xmlns='urn:xmpp:hints'/></message>"), Kind::Skip);
        assert_eq!(c("<message xmlns='jabber:client' type='chat'><active xmlns='http://jabber.org/protocol/chatstates'/></message>"), Kind::Skip);
        assert_eq!(
            c("<message xmlns='jabber:client' type='headline'><body>x</body></message>"),
            Kind::Skip
        );
        assert_eq!(
            c("<message xmlns='jabber:client' type='groupchat'><body>x</body></message>"),
            Kind::Skip
        );
        assert_eq!(
            c("<message xmlns='jabber:client' type='error'><body>x</body></message>"),
            Kind::Skip
        );
        assert_eq!(
            c("<message xmlns='jabber:client'><received xmlns='urn:xmpp:carbons:2'/></message>"),
            Kind::Skip
        );
    }

    #[tokio::test]
    async fn ids_stay_unique_and_increasing_when_the_store_is_ahead_of_the_clock() {
        let dir =
            std::env::temp_dir().join(format!("starling-mam-{}", starling_proto::random_id(8)));
        let storage = crate::modules::open_storage(&starling_storage::BackendConfig::Sqlite {
            path: dir.join("db.sqlite"),
            pool_size: 1,
        })
        .await
        .unwrap();
        // A record from another node, an hour in the future (a clock that
        // stepped back after a restart).
        let future = ArchiveId::from_parts(now_micros() + 3_600_000_000, 7);
        storage
            .archive
            .append(&[ArchiveRecord {
                owner: BareJid::new("a@x").unwrap(),
                id: future,
                with_bare: "b@x".into(),
                remote: "b@x".into(),
                outgoing: false,
                origin_id: None,
                flags: FLAG_BODY,
                stanza: "<message xmlns='jabber:client'/>".into(),
            }])
            .await
            .unwrap();
        let mut reg = HookRegistry::new();
        let cfg = MamConfig::default();
        let metrics = Metrics::new();
        let pressure = Arc::new(Pressure::new());
        let ids = crate::server::archive_ids(&storage, 3).await;
        let m = Mam::register(&cfg, &[], ids, &storage, &metrics, &pressure, &mut reg).await;
        let ids: Vec<ArchiveId> = (0..1000).map(|_| m.next_id()).collect();
        assert!(ids[0].micros() > future.micros());
        assert!(ids.windows(2).all(|w| w[0].micros() < w[1].micros()));
        assert!(ids.iter().all(|i| i.0 & 0xff == 3), "the node byte is ours");
        m.queue.close().await;
        storage.backend.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn origin_id_prefers_xep0359() {
        assert_eq!(
            origin_id(&el("<message xmlns='jabber:client' id='a'><origin-id xmlns='urn:xmpp:sid:0' id='b'/></message>")),
            Some("b".into())
        );
        assert_eq!(
            origin_id(&el("<message xmlns='jabber:client' id='a'/>")),
            Some("a".into())
        );
    }
}
