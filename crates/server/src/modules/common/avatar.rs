//! What the vCard module and PEP share about a user's avatar (XEP-0398):
//! the XEP-0084 namespaces and the PEP avatar read back as a vCard
//! `PHOTO`. The vcard module serves a vCard without a `PHOTO` with the
//! PEP avatar's ([`vcard_photo`]); PEP (`modules/pep/avatar.rs`) stamps
//! presence and turns a vCard `PHOTO` into a PEP avatar. Both read the
//! account's PEP nodes through storage, so neither imports the other.

use starling_core::Env;
use starling_proto::BareJid;
use starling_xml::Element;

/// XEP-0084's nodes and payload namespaces.
pub const NS_DATA: &str = "urn:xmpp:avatar:data";
/// Metadata.
pub const NS_METADATA: &str = "urn:xmpp:avatar:metadata";
/// XEP-0153 presence element.
pub const NS_UPDATE: &str = "vcard-temp:x:update";
/// vCard (XEP-0054).
pub const NS_VCARD: &str = "vcard-temp";
/// The feature PEP advertises on accounts (XEP-0398).
pub const FEATURE: &str = "urn:xmpp:pep-vcard-conversion:0";

/// The current avatar's metadata `<info/>` (the first one), if any.
pub async fn info(env: &Env, owner: &BareJid) -> Option<Element> {
    let items = env
        .storage
        .pubsub
        .items(owner.as_str(), NS_METADATA, Some(1))
        .await
        .ok()?;
    let meta = items.first()?.payload.parse::<Element>().ok()?;
    meta.get_child("info", NS_METADATA).cloned()
}

/// The PEP avatar as a vCard `PHOTO` (`TYPE` and `BINVAL`), for a vCard
/// that has none.
pub async fn vcard_photo(env: &Env, owner: &BareJid) -> Option<Element> {
    let info = info(env, owner).await?;
    let id = info.attr("id")?;
    let items = env
        .storage
        .pubsub
        .items_by_id(owner.as_str(), NS_DATA, &[id.to_owned()])
        .await
        .ok()?;
    let data = items.first()?.payload.parse::<Element>().ok()?;
    let b64: String = data.text().split_whitespace().collect();
    let mut photo = Element::new("PHOTO", NS_VCARD);
    photo.append_child(
        Element::builder("TYPE", NS_VCARD)
            .text(info.attr("type").unwrap_or("image/png"))
            .build(),
    );
    photo.append_child(Element::builder("BINVAL", NS_VCARD).text(b64).build());
    Some(photo)
}
