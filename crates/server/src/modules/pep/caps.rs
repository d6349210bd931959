//! Entity capabilities (XEP-0115) as PEP follows them: a session's `<c/>`
//! in available presence, the disco#info query for an unknown `ver`, the
//! answer verified (§5.4) and cached for everyone (in storage, for a
//! cluster), and which nodes' notifications (`NODE+notify`, XEP-0163
//! §4.2.1) a resource asked for.

use super::{avatar, Pep, NAME};
use starling_core::hooks::UserSendHandler;
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx};
use starling_proto::{ns, BareJid, Stanza, StanzaKind};
use starling_xml::Element;
use std::collections::HashSet;
use std::sync::Arc;

const NS_CAPS: &str = "http://jabber.org/protocol/caps";

/// Distinct capability `ver`s remembered before the cache starts over.
const CAPS_CACHE_LIMIT: usize = 10_000;

/// Verified capabilities are kept in `user_data` (kind `caps`, key
/// `hash:ver`, value: the features, one per line) under this pseudo-owner,
/// so every node of a cluster knows what any node verified. A domain that
/// can never be served (RFC 2606 `.invalid`).
const CAPS_KIND: &str = "caps";

fn caps_owner() -> BareJid {
    BareJid::new("capabilities.starling.invalid").expect("a valid domain JID")
}

/// The session's capabilities as the module follows them.
#[derive(Default)]
struct CapsState {
    /// The `hash:ver` of the last available presence with capabilities.
    ver: Option<String>,
    /// Our disco#info query waiting for its answer: (id, hash, ver).
    pending: Option<(String, String, String)>,
    /// The `ver` the last items were delivered for.
    delivered: Option<String>,
}

impl Pep {
    /// Verified capabilities `key` (`hash:ver`): from this node's cache,
    /// else from storage (verified by any node of a cluster), else `None`.
    pub(super) async fn features(&self, env: &Env, key: &str) -> Option<Arc<HashSet<String>>> {
        if let Some(f) = self.caps.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Some(f.clone());
        }
        let stored = match env
            .storage
            .user_data
            .get(&caps_owner(), CAPS_KIND, key)
            .await
        {
            Ok(s) => s?,
            Err(e) => {
                tracing::warn!(module = NAME, caps = key, error = %e, "reading stored capabilities failed");
                return None;
            }
        };
        let features: Arc<HashSet<String>> = Arc::new(
            stored
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
        );
        self.remember(key, features.clone());
        Some(features)
    }

    fn remember(&self, key: &str, features: Arc<HashSet<String>>) {
        let mut caps = self.caps.write().unwrap_or_else(|e| e.into_inner());
        if caps.len() >= CAPS_CACHE_LIMIT {
            caps.clear();
        }
        caps.insert(key.to_owned(), features);
    }

    /// Whether the resource whose last presence is `presence` asked for
    /// `node`'s notifications.
    pub(super) async fn wants(&self, env: &Env, presence: Option<&Element>, node: &str) -> bool {
        let Some(key) = presence.and_then(caps_key) else {
            return false;
        };
        self.features(env, &key)
            .await
            .is_some_and(|f| f.contains(&format!("{node}+notify")))
    }
}

/// `hash:ver` of a presence's capabilities (XEP-0115 §4), if it has
/// hashed ones.
pub(super) fn caps_key(presence: &Element) -> Option<String> {
    let c = presence.get_child("c", NS_CAPS)?;
    let hash = c.attr("hash")?;
    let ver = c.attr("ver")?;
    Some(format!("{hash}:{ver}"))
}

/// The verification string of a disco#info result (XEP-0115 §5.1) and
/// its features, or `None` if the result breaks §5.4's rules (duplicate
/// identities or features, forms without one FORM_TYPE).
fn caps_string(query: &Element) -> Option<(String, HashSet<String>)> {
    let mut ids: Vec<String> = query
        .children()
        .filter(|c| c.is("identity", ns::DISCO_INFO))
        .map(|i| {
            format!(
                "{}/{}/{}/{}",
                i.attr("category").unwrap_or(""),
                i.attr("type").unwrap_or(""),
                i.attr("xml:lang").unwrap_or(""),
                i.attr("name").unwrap_or("")
            )
        })
        .collect();
    let mut features: Vec<String> = query
        .children()
        .filter(|c| c.is("feature", ns::DISCO_INFO))
        .filter_map(|f| f.attr("var").map(str::to_owned))
        .collect();
    let (n_ids, n_features) = (ids.len(), features.len());
    ids.sort();
    ids.dedup();
    features.sort();
    features.dedup();
    if ids.len() != n_ids || features.len() != n_features {
        return None;
    }
    let mut s = String::new();
    for i in &ids {
        s.push_str(i);
        s.push('<');
    }
    for f in &features {
        s.push_str(f);
        s.push('<');
    }
    let mut forms = Vec::new();
    for x in query.children().filter(|c| c.is("x", ns::DATA_FORMS)) {
        let types: Vec<String> = x
            .children()
            .filter(|f| f.attr("var") == Some("FORM_TYPE"))
            .flat_map(|f| {
                f.children()
                    .filter(|v| v.name() == "value")
                    .map(|v| v.text())
            })
            .collect();
        let [form_type] = &types[..] else {
            continue; // no FORM_TYPE: ignored (§5.4 3.6)
        };
        let mut fields: Vec<(String, Vec<String>)> = x
            .children()
            .filter(|f| f.name() == "field" && f.attr("var").is_some_and(|v| v != "FORM_TYPE"))
            .map(|f| {
                let mut v: Vec<String> = f
                    .children()
                    .filter(|v| v.name() == "value")
                    .map(|v| v.text())
                    .collect();
                v.sort();
                (f.attr("var").unwrap_or("").to_owned(), v)
            })
            .collect();
        fields.sort();
        let mut part = format!("{form_type}<");
        for (var, values) in fields {
            part.push_str(&var);
            part.push('<');
            for v in values {
                part.push_str(&v);
                part.push('<');
            }
        }
        forms.push((form_type.clone(), part));
    }
    forms.sort();
    if forms.windows(2).any(|w| w[0].0 == w[1].0) {
        return None; // two forms with one FORM_TYPE (§5.4 3.4)
    }
    for (_, part) in forms {
        s.push_str(&part);
    }
    Some((s, features.into_iter().collect()))
}

/// Whether `ver` is the `hash` of `s` (sha-1 or sha-256, base64).
fn caps_match(hash: &str, ver: &str, s: &str) -> bool {
    use base64::Engine;
    use sha1::Digest as _;
    let digest = match hash {
        "sha-1" => sha1::Sha1::digest(s.as_bytes()).to_vec(),
        "sha-256" => sha2::Sha256::digest(s.as_bytes()).to_vec(),
        _ => return false,
    };
    base64::engine::general_purpose::STANDARD.encode(digest) == ver
}

#[async_trait]
impl UserSendHandler for Pep {
    /// Follows the session's capabilities: asks for unknown ones, takes
    /// the answer, and delivers the last items once they are known.
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        match stanza.kind() {
            StanzaKind::Presence if stanza.to().is_none() && stanza.type_attr().is_none() => {
                if self.vcard_conversion {
                    avatar::stamp_presence(cx.env, &cx.jid().to_bare(), stanza).await;
                }
                let Some(key) = caps_key(stanza.element()) else {
                    return Ok(Flow::Continue);
                };
                let known = self.features(cx.env, &key).await;
                let st = cx.state.get_or_insert_with(CapsState::default);
                st.ver = Some(key.clone());
                match known {
                    Some(features) if st.delivered.as_ref() != Some(&key) => {
                        st.delivered = Some(key);
                        self.deliver_last_soon(cx.jid().to_bare(), cx.jid().clone(), features);
                    }
                    Some(_) => {}
                    None if st.pending.is_none() => {
                        let c = stanza
                            .element()
                            .get_child("c", NS_CAPS)
                            .expect("caps_key found it");
                        let (hash, ver) = key.split_once(':').expect("made with a colon");
                        let (hash, ver) = (hash.to_owned(), ver.to_owned());
                        let id = format!("caps-{}", starling_proto::random_id(8));
                        let mut q = Element::new("query", ns::DISCO_INFO);
                        q.set_attr("node", format!("{}#{ver}", c.attr("node").unwrap_or("")));
                        let mut iq = Element::builder("iq", ns::CLIENT)
                            .attr("type", "get")
                            .attr("id", id.clone())
                            .attr("from", cx.info.domain.clone())
                            .attr("to", cx.jid().as_str())
                            .build();
                        iq.append_child(q);
                        cx.state.get_or_insert_with(CapsState::default).pending =
                            Some((id, hash, ver));
                        cx.send(iq);
                    }
                    None => {}
                }
                Ok(Flow::Continue)
            }
            StanzaKind::Iq
                if self.vcard_conversion
                    && stanza.type_attr() == Some("set")
                    && stanza
                        .to()
                        .is_none_or(|t| t.to_bare() == cx.jid().to_bare()) =>
            {
                if let Some(card) = stanza.payload().filter(|p| p.is("vCard", "vcard-temp")) {
                    let owner = cx.jid().to_bare();
                    avatar::vcard_set(self, cx.env, &owner, card).await;
                }
                Ok(Flow::Continue)
            }
            StanzaKind::Iq if !stanza.is_iq_request() => {
                let Some((id, hash, ver)) =
                    cx.state.get::<CapsState>().and_then(|s| s.pending.clone())
                else {
                    return Ok(Flow::Continue);
                };
                if stanza.id() != Some(id.as_str()) {
                    return Ok(Flow::Continue);
                }
                if let Some(s) = cx.state.get_mut::<CapsState>() {
                    s.pending = None;
                }
                let verified = stanza
                    .element()
                    .get_child("query", ns::DISCO_INFO)
                    .filter(|_| stanza.type_attr() == Some("result"))
                    .and_then(caps_string)
                    .filter(|(s, _)| caps_match(&hash, &ver, s));
                let key = format!("{hash}:{ver}");
                match verified {
                    Some((_, features)) => {
                        let mut lines: Vec<&str> = features.iter().map(String::as_str).collect();
                        lines.sort_unstable();
                        if let Err(e) = cx
                            .env
                            .storage
                            .user_data
                            .set(&caps_owner(), CAPS_KIND, &key, &lines.join("\n"))
                            .await
                        {
                            tracing::warn!(module = NAME, caps = %key, error = %e, "storing verified capabilities failed");
                        }
                        let features = Arc::new(features);
                        self.remember(&key, features.clone());
                        let current = cx.state.get::<CapsState>().and_then(|s| s.ver.clone());
                        if current.as_ref() == Some(&key) {
                            if let Some(s) = cx.state.get_mut::<CapsState>() {
                                s.delivered = Some(key);
                            }
                            self.deliver_last_soon(cx.jid().to_bare(), cx.jid().clone(), features);
                        }
                    }
                    None => {
                        starling_core::log_throttled!(info, module = NAME, jid = %cx.jid(), caps = %key, "capabilities not verified (§5.4): not cached");
                    }
                }
                Ok(Flow::Stop)
            }
            _ => Ok(Flow::Continue),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// XEP-0115 §5.2's simple example and §5.3's complex one.
    #[test]
    fn caps_strings_and_hashes_match_the_xep_examples() {
        let simple: Element = "<query xmlns='http://jabber.org/protocol/disco#info'>\
            <identity category='client' name='Exodus 0.9.1' type='pc'/>\
            <feature var='http://jabber.org/protocol/caps'/>\
            <feature var='http://jabber.org/protocol/disco#info'/>\
            <feature var='http://jabber.org/protocol/disco#items'/>\
            <feature var='http://jabber.org/protocol/muc'/></query>"
            .parse()
            .unwrap();
        let (s, f) = caps_string(&simple).unwrap();
        assert_eq!(s, "client/pc//Exodus 0.9.1<http://jabber.org/protocol/caps<http://jabber.org/protocol/disco#info<http://jabber.org/protocol/disco#items<http://jabber.org/protocol/muc<");
        assert!(caps_match("sha-1", "QgayPKawpkPSDYmwT/WM94uAlu0=", &s));
        assert!(f.contains("http://jabber.org/protocol/muc"));
        let complex: Element = "<query xmlns='http://jabber.org/protocol/disco#info'>\
            <identity xml:lang='en' category='client' name='Psi 0.11' type='pc'/>\
            <identity xml:lang='el' category='client' name='Ψ 0.11' type='pc'/>\
            <feature var='http://jabber.org/protocol/caps'/>\
            <feature var='http://jabber.org/protocol/disco#info'/>\
            <feature var='http://jabber.org/protocol/disco#items'/>\
            <feature var='http://jabber.org/protocol/muc'/>\
            <x xmlns='jabber:x:data' type='result'>\
              <field var='FORM_TYPE' type='hidden'><value>urn:xmpp:dataforms:softwareinfo</value></field>\
              <field var='ip_version'><value>ipv4</value><value>ipv6</value></field>\
              <field var='os'><value>Mac</value></field>\
              <field var='os_version'><value>10.5.1</value></field>\
              <field var='software'><value>Psi</value></field>\
              <field var='software_version'><value>0.11</value></field>\
            </x></query>"
            .parse()
            .unwrap();
        let (s, _) = caps_string(&complex).unwrap();
        assert!(
            caps_match("sha-1", "q07IKJEyjvHSyhy//CH0CxmKi8w=", &s),
            "{s}"
        );
        assert!(!caps_match("sha-1", "QgayPKawpkPSDYmwT/WM94uAlu0=", &s));
        // §5.4: a duplicate feature makes the answer unusable.
        let dup: Element = "<query xmlns='http://jabber.org/protocol/disco#info'>\
            <feature var='a'/><feature var='a'/></query>"
            .parse()
            .unwrap();
        assert!(caps_string(&dup).is_none());
    }
}
