//! User avatar to vCard-based avatar conversion (XEP-0398, feature
//! `urn:xmpp:pep-vcard-conversion:0` on the account), so clients that know
//! only vCard avatars (XEP-0153) and clients that use PEP avatars
//! (XEP-0084) see the same picture:
//!
//! - the server puts the avatar's hash in the user's available presence
//!   (`<x xmlns='vcard-temp:x:update'><photo>sha1</photo></x>`, XEP-0398
//!   §3.1) when the client did not (a client that sends its own `x` keeps
//!   it);
//! - a vCard without a `PHOTO` is served with the PEP avatar's (§3.2: the
//!   vcard module asks [`vcard_photo`]);
//! - a vCard set with a `PHOTO` publishes it as the PEP avatar, data then
//!   metadata (§3.3), so PEP clients are notified.

use super::{Pep, NS_PUBSUB};
use base64::Engine;
use sha1::Digest;
use starling_core::Env;
use starling_proto::{BareJid, Stanza};
use starling_xml::Element;

pub use crate::modules::common::avatar::FEATURE;
use crate::modules::common::avatar::{info, NS_DATA, NS_METADATA, NS_UPDATE, NS_VCARD};

/// Adds the avatar hash to an available presence that has no
/// `vcard-temp:x:update` of its own.
pub(super) async fn stamp_presence(env: &Env, owner: &BareJid, presence: &mut Stanza) {
    if presence.element().has_child("x", NS_UPDATE) {
        return;
    }
    let Some(id) = info(env, owner)
        .await
        .and_then(|i| i.attr("id").map(str::to_owned))
    else {
        return;
    };
    let x = Element::builder("x", NS_UPDATE)
        .append(Element::builder("photo", NS_UPDATE).text(id).build())
        .build();
    presence.element_mut().append_child(x);
}

/// A vCard set by its owner: its `PHOTO` becomes the PEP avatar (data,
/// then metadata) unless it is the current one already.
pub(super) async fn vcard_set(pep: &Pep, env: &Env, owner: &BareJid, card: &Element) {
    let Some(photo) = card.get_child("PHOTO", NS_VCARD) else {
        return;
    };
    let Some(b64) = photo
        .get_child("BINVAL", NS_VCARD)
        .map(|b| b.text().split_whitespace().collect::<String>())
    else {
        return;
    };
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&b64) else {
        return;
    };
    if bytes.is_empty() {
        return;
    }
    let id: String = sha1::Sha1::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if info(env, owner)
        .await
        .and_then(|i| i.attr("id").map(str::to_owned))
        == Some(id.clone())
    {
        return;
    }
    let kind = photo
        .get_child("TYPE", NS_VCARD)
        .map(|t| t.text())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "image/png".into());
    let Ok(publisher) = owner.with_resource_str("vcard") else {
        return;
    };
    let data = Element::builder("data", NS_DATA).text(b64).build();
    let meta = Element::builder("metadata", NS_METADATA)
        .append(
            Element::builder("info", NS_METADATA)
                .attr("id", id.as_str())
                .attr("bytes", bytes.len().to_string())
                .attr("type", kind)
                .build(),
        )
        .build();
    for (node, payload) in [(NS_DATA, data), (NS_METADATA, meta)] {
        let p = Element::builder("publish", NS_PUBSUB)
            .attr("node", node)
            .append(
                Element::builder("item", NS_PUBSUB)
                    .attr("id", id.as_str())
                    .append(payload)
                    .build(),
            )
            .build();
        let ps = Element::builder("pubsub", NS_PUBSUB)
            .append(p.clone())
            .build();
        if let Err(e) = pep.publish(env, owner, &publisher, &ps, &p).await {
            tracing::warn!(module = super::NAME, user = %owner, node, error = %e, "publishing the vCard photo as the PEP avatar failed");
            return;
        }
    }
}
