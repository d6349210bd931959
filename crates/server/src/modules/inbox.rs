//! Inbox (XEP-0430 `urn:xmpp:inbox:1`): the conversation list with the
//! last message and an unread count per conversation, kept up to date as
//! messages are archived, modelled on MongooseIM's `mod_inbox`.
//!
//! - Every archived instant message updates the conversation of both
//!   parties: the last message (with its archive id) and the unread count —
//!   +1 for the recipient, reset to 0 for the sender (who has obviously
//!   read the conversation, as in MongooseIM). Corrections (XEP-0308)
//!   replace the last message without counting as unread. Receipts
//!   (XEP-0184) change nothing (XEP-0430 §4).
//! - A `displayed` or `acknowledged` chat marker (XEP-0333) the user sends
//!   marks the referenced message and everything before it as read: the
//!   count becomes the number of received instant messages after it in the
//!   archive (0 when it is the newest; 0 as well when the message is not in
//!   the archive). A marker for the newest received message (the usual
//!   case) is recognised from memory and costs no database access.
//!   Markers reach the user's other devices as sent carbons, so every
//!   device converges.
//! - Explicit reset, MongooseIM-compatible: `<reset
//!   xmlns='erlang-solutions.com:xmpp:inbox:0#conversation' jid='…'/>` in
//!   an iq set sets a conversation's count to 0.
//! - Conversations store the archive id of their last message, and the
//!   listing joins the archive: rows stay small (each message updates two
//!   of them), and a retraction (XEP-0424) of the last message shows its
//!   tombstone in the inbox too.
//! - Query (XEP-0430 §3): iq get `<inbox unread-only='…' messages='…'>` with
//!   optional RSM (`max`, `after`/`before` an entry's id, newest first).
//!   One `<message>` per conversation with `<entry jid unread id/>` and,
//!   unless `messages='false'`, the last message as a MAM `<result/>`; then
//!   the iq result with `<fin total unread all-unread>` and RSM
//!   first/last/count.
//! - Updates go through a write-behind queue; backends merge a batch's
//!   updates per conversation into multi-row statements; queries flush the
//!   queue first.
//!
//! Hooks: `archived` (what the archive keeps), `shutdown`; own-account iq
//! handlers `{urn:xmpp:inbox:1}inbox` and `{…#conversation}reset`
//! (answered in the requesting session; other accounts' requests get
//! `forbidden`); disco features on the account
//! and the server. Storage: `InboxStore`.
//! Config: `[modules.inbox]` (needs `[modules.mam]`).

use crate::modules::common::write_behind::{BatchSink, WriteBehind, WriteBehindConfig};
use starling_core::disco::Scopes;
use starling_core::hooks::{
    Archived, ArchivedHandler, HookRegistry, IqHandler, IqResponse, IqScope, OwnIqHandler,
    ShutdownHandler,
};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{
    ArchiveId, InboxQuery, InboxStore, InboxUpdate, Storage, StorageResult, UnreadChange,
};
use starling_core::{async_trait, Env, Metrics, Pressure, SessionCtx};
use starling_proto::mam::{origin_id, result_message, rsm_first_last, Kind, NS_RSM};
use starling_proto::{ns, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// `[modules.inbox]`: conversation list with unread counts (XEP-0430).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboxConfig {
    /// Run the module (needs `[modules.mam]`).
    pub enabled: bool,
    /// Conversations per query when it gives no RSM `<max/>`.
    pub default_page_size: u32,
    /// Largest page a query may ask for.
    pub max_page_size: u32,
    /// Write-behind queue: updates waiting at most before senders wait.
    pub queue_capacity: usize,
    /// Write-behind queue: MiB the waiting records may hold at most
    /// before senders wait (half of it raises the back-pressure).
    pub queue_max_mib: usize,
    /// Write-behind queue: updates per database transaction at most.
    pub batch_size: usize,
    /// Write-behind queue: milliseconds a small batch waits for more.
    pub batch_delay_ms: u64,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            enabled: true,
            default_page_size: 50,
            max_page_size: 250,
            queue_capacity: 100_000,
            queue_max_mib: 16,
            batch_size: 20_000,
            batch_delay_ms: 500,
        }
    }
}

const NAME: &str = "inbox";
/// XEP-0430 namespace.
pub const NS_INBOX: &str = "urn:xmpp:inbox:1";
/// MongooseIM's conversation-properties namespace (reset).
pub const NS_CONVERSATION: &str = "erlang-solutions.com:xmpp:inbox:0#conversation";

fn conversation_key(owner: &BareJid, peer: &BareJid) -> String {
    format!("{owner}\n{peer}")
}

/// The inbox module.
pub struct Inbox {
    store: Arc<dyn InboxStore>,
    queue: WriteBehind<InboxUpdate>,
    default_page: u32,
    max_page: u32,
    /// Origin id of the newest instant message each conversation received
    /// on this node, keyed `owner \n peer`: a marker for it (the usual
    /// case) means nothing is unread, without flushing the archive queue
    /// or reading the archive.
    newest: Mutex<HashMap<String, String>>,
}

/// Entries of [`Inbox::newest`] kept at most (then it starts over).
const NEWEST_MAX: usize = 100_000;

struct Sink(Arc<dyn InboxStore>);

#[async_trait]
impl BatchSink<InboxUpdate> for Sink {
    async fn write(&self, batch: &[InboxUpdate]) -> StorageResult<()> {
        // Backends merge per conversation (coalesce_inbox_updates).
        self.0.apply(batch).await
    }
}

impl Inbox {
    /// Registers the module; it follows the archive through the
    /// `archived` hook.
    fn register(
        cfg: &InboxConfig,
        storage: &Storage,
        metrics: &Metrics,
        pressure: &Arc<Pressure>,
        reg: &mut HookRegistry,
    ) {
        let store = storage.inbox.clone();
        let queue = WriteBehind::spawn(
            "inbox",
            Arc::new(Sink(store.clone())),
            WriteBehindConfig {
                capacity: cfg.queue_capacity,
                max_bytes: cfg.queue_max_mib.saturating_mul(1 << 20),
                max_batch: cfg.batch_size,
                max_delay: std::time::Duration::from_millis(cfg.batch_delay_ms),
            },
            metrics.write_behind.queue("inbox"),
            pressure.clone(),
        );
        let m = Arc::new(Inbox {
            store,
            queue,
            default_page: cfg.default_page_size,
            max_page: cfg.max_page_size,
            newest: Mutex::new(HashMap::new()),
        });
        reg.archived(NAME, 50, m.clone());
        // After the archive's shutdown (90): sessions are gone by then, so
        // nothing pushes updates any more.
        reg.shutdown(NAME, 95, m.clone());
        reg.own_iq(NAME, "inbox", NS_INBOX, m.clone());
        reg.own_iq(NAME, "reset", NS_CONVERSATION, m.clone());
        reg.iq(
            NAME,
            IqScope::Account,
            "inbox",
            NS_INBOX,
            Arc::new(NotYourInbox),
        );
        reg.iq(
            NAME,
            IqScope::Account,
            "reset",
            NS_CONVERSATION,
            Arc::new(NotYourInbox),
        );
        // On the account and, as MongooseIM does, on the server, where
        // clients look for it (XEP-0430 §2.1 names no JID).
        reg.disco()
            .feature(Scopes::BOTH, NS_INBOX)
            .feature(Scopes::BOTH, NS_CONVERSATION);
    }

    /// The owner sent an archived message `id` to `peer`.
    async fn outgoing(&self, env: &Env, msg: &Archived<'_>) {
        let &Archived {
            owner,
            peer,
            id,
            kind,
            element: el,
            shared,
            ..
        } = msg;
        match kind {
            Kind::Instant | Kind::Correction => {
                self.push(owner, peer, Some(id), UnreadChange::Set(0), shared)
                    .await;
            }
            Kind::Other => {
                let marker = el
                    .children()
                    .find(|c| {
                        c.ns() == ns::CHAT_MARKERS
                            && matches!(c.name(), "displayed" | "acknowledged")
                    })
                    .and_then(|c| c.attr("id"));
                if let Some(marked) = marker {
                    let newest = self
                        .newest
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&conversation_key(owner, peer))
                        .is_some_and(|o| o == marked);
                    let n = if newest {
                        0
                    } else {
                        self.unread_after(env, owner, peer, marked).await
                    };
                    self.push(owner, peer, None, UnreadChange::Set(n), shared)
                        .await;
                }
            }
            Kind::Skip => {}
        }
    }

    /// The owner received an archived message `id` from `peer`.
    async fn incoming(&self, msg: &Archived<'_>) {
        let &Archived {
            owner,
            peer,
            id,
            kind,
            element: el,
            shared,
            ..
        } = msg;
        match kind {
            Kind::Instant => {
                if let Some(o) = origin_id(el) {
                    let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
                    if newest.len() >= NEWEST_MAX {
                        newest.clear();
                    }
                    newest.insert(conversation_key(owner, peer), o);
                }
                self.push(owner, peer, Some(id), UnreadChange::Add(1), shared)
                    .await
            }
            Kind::Correction => {
                self.push(owner, peer, Some(id), UnreadChange::Keep, shared)
                    .await
            }
            Kind::Other | Kind::Skip => {}
        }
    }

    async fn push(
        &self,
        owner: &BareJid,
        peer: &BareJid,
        last: Option<ArchiveId>,
        unread: UnreadChange,
        shared: bool,
    ) {
        self.queue
            .push(InboxUpdate {
                owner: owner.clone(),
                remote: peer.as_str().to_owned(),
                last,
                unread,
                shared,
            })
            .await;
    }

    /// Received instant messages from `peer` after the one with origin id
    /// `marked` (XEP-0430 §4: a marker reads everything before it).
    async fn unread_after(&self, env: &Env, owner: &BareJid, peer: &BareJid, marked: &str) -> u32 {
        // Read-your-writes: the archive's queued rows first.
        env.hooks.durable(env).await;
        let store = &env.storage.archive;
        let r = async {
            match store
                .find_by_origin(owner, peer.as_str(), marked, false)
                .await?
            {
                Some(m) => store.count_unread_after(owner, peer.as_str(), m.id).await,
                None => Ok(0),
            }
        }
        .await;
        match r {
            Ok(n) => u32::try_from(n).unwrap_or(u32::MAX),
            Err(e) => {
                tracing::error!(module = NAME, user = %owner, error = %e, "counting unread messages failed; resetting to 0");
                0
            }
        }
    }

    async fn run_query(
        &self,
        env: &Env,
        owner: &BareJid,
        requester: &FullJid,
        iq: &Stanza,
    ) -> Result<(Vec<Element>, Element), StanzaError> {
        let p = iq.payload().expect("checked by caller");
        let flag = |name: &str, default: bool| -> Result<bool, StanzaError> {
            match p.attr(name) {
                None => Ok(default),
                Some("true" | "1") => Ok(true),
                Some("false" | "0") => Ok(false),
                Some(_) => Err(StanzaError::new(StanzaErrorCondition::BadRequest)
                    .with_text(format!("'{name}' must be true or false"))),
            }
        };
        let unread_only = flag("unread-only", false)?;
        let messages = flag("messages", true)?;
        let bad = |t: &str| StanzaError::new(StanzaErrorCondition::BadRequest).with_text(t);
        let not_found = || {
            StanzaError::new(StanzaErrorCondition::ItemNotFound)
                .with_text("no conversation with this id in the inbox")
        };
        let mut q = InboxQuery {
            unread_only,
            limit: self.default_page,
            ..Default::default()
        };
        if let Some(set) = p.get_child("set", NS_RSM) {
            for c in set.children() {
                match c.name() {
                    "max" => {
                        let m: u32 = c
                            .text()
                            .trim()
                            .parse()
                            .map_err(|_| bad("<max/> must be a number"))?;
                        q.limit = m.min(self.max_page);
                    }
                    // Pages run newest first: the next page is older.
                    "after" => {
                        q.before = Some(ArchiveId::decode(c.text().trim()).ok_or_else(not_found)?)
                    }
                    "before" => {
                        let t = c.text();
                        if !t.trim().is_empty() {
                            q.after = Some(ArchiveId::decode(t.trim()).ok_or_else(not_found)?);
                        }
                    }
                    "index" => {
                        return Err(
                            StanzaError::new(StanzaErrorCondition::FeatureNotImplemented)
                                .with_text("RSM <index/> is not supported"),
                        )
                    }
                    _ => return Err(bad("unexpected element in <set/>")),
                }
            }
        }
        // The listing joins the archive: both queues are written first.
        env.hooks.durable(env).await;
        self.queue.flush().await;
        let backend = |e: starling_core::storage::StorageError| {
            tracing::error!(module = NAME, user = %owner, error = %e, "inbox query failed");
            StanzaError::new(StanzaErrorCondition::InternalServerError)
        };
        let entries = if q.limit == 0 {
            Vec::new()
        } else {
            self.store.list(owner, &q).await.map_err(backend)?
        };
        let totals = self.store.totals(owner).await.map_err(backend)?;
        let queryid = iq.id();
        let mut out = Vec::with_capacity(entries.len());
        for e in &entries {
            let mut msg = Element::builder("message", starling_proto::ns::CLIENT)
                .attr("from", owner.as_str())
                .attr("to", requester.as_str())
                .append(
                    Element::builder("entry", NS_INBOX)
                        .attr("jid", e.remote.as_str())
                        .attr("unread", e.unread.to_string())
                        .attr("id", e.last_id.encode())
                        .build(),
                )
                .build();
            if messages {
                if let Some(Ok(stored)) = e.last_stanza.as_deref().map(str::parse::<Element>) {
                    let r = result_message(
                        owner,
                        requester,
                        queryid,
                        &e.last_id.encode(),
                        &e.last_id.stamp(),
                        stored,
                    );
                    let result = r.children().next().cloned();
                    if let Some(result) = result {
                        msg.append_child(result);
                    }
                }
            }
            out.push(msg);
        }
        let mut set = Element::new("set", NS_RSM);
        rsm_first_last(
            &mut set,
            entries.first().map(|e| e.last_id.encode()),
            entries.last().map(|e| e.last_id.encode()),
        );
        set.append_child(
            Element::builder("count", NS_RSM)
                .text(totals.conversations.to_string())
                .build(),
        );
        let fin = Element::builder("fin", NS_INBOX)
            .attr("total", totals.conversations.to_string())
            .attr("unread", totals.unread_conversations.to_string())
            .attr("all-unread", totals.unread_messages.to_string())
            .append(set)
            .build();
        let mut reply = iq.iq_result(Some(fin));
        reply.set_from(Some(owner.clone().into()));
        reply.set_to(Some(requester.clone().into()));
        Ok((out, reply.into_element()))
    }

    async fn reset(&self, owner: &BareJid, iq: &Stanza) -> IqResponse {
        let p = iq.payload().expect("routed by payload");
        let Some(jid) = p.attr("jid").and_then(|j| j.parse::<Jid>().ok()) else {
            return IqResponse::Error(
                StanzaError::new(StanzaErrorCondition::BadRequest)
                    .with_text("reset needs a valid 'jid' attribute"),
            );
        };
        self.push(owner, &jid.to_bare(), None, UnreadChange::Set(0), false)
            .await;
        self.queue.flush().await;
        IqResponse::Result(None)
    }
}

#[async_trait]
impl ArchivedHandler for Inbox {
    async fn archived(&self, env: &Env, msg: &Archived<'_>) {
        if msg.outgoing {
            self.outgoing(env, msg).await;
        } else {
            self.incoming(msg).await;
        }
    }
}

#[async_trait]
impl OwnIqHandler for Inbox {
    async fn own_iq(&self, cx: &mut SessionCtx<'_>, iq: &Stanza) -> IqResponse {
        let me = cx.jid().clone();
        let owner = me.to_bare();
        let p = iq.payload().expect("dispatched by payload");
        match (p.name(), iq.type_attr()) {
            // Straight to this session, like archive pages.
            ("inbox", Some("get")) => match self.run_query(cx.env, &owner, &me, iq).await {
                Ok((entries, fin)) => {
                    for e in entries {
                        cx.send(e);
                    }
                    cx.send(fin);
                    IqResponse::Handled
                }
                Err(e) => IqResponse::Error(e),
            },
            ("reset", Some("set")) => self.reset(&owner, iq).await,
            _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
        }
    }
}

/// Requests for someone else's inbox (own ones are answered in-session).
struct NotYourInbox;

#[async_trait]
impl IqHandler for NotYourInbox {
    async fn handle_iq(&self, _env: &Env, _scope: IqScope, _iq: &Stanza) -> IqResponse {
        IqResponse::Error(
            StanzaError::new(StanzaErrorCondition::Forbidden)
                .with_text("only the owner of an inbox can use it"),
        )
    }
}

#[async_trait]
impl ShutdownHandler for Inbox {
    async fn shutdown(&self, _env: &Env) {
        self.queue.close().await;
    }
}

impl Module for Inbox {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0430 inbox: conversations with unread counts";
    type Config = InboxConfig;
    const STORAGE: &'static [&'static str] = &["inbox", "archive"];
    const NEEDS: &'static [&'static str] = &["mam"];

    fn enabled(cfg: &InboxConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &InboxConfig, _domains: &[String]) -> Result<(), ConfigProblem> {
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
        Ok(())
    }

    async fn start(cfg: &InboxConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Inbox::register(cfg, ctx.storage, ctx.metrics, ctx.pressure, reg);
    }
}
