//! Message archive vocabulary (XEP-0313 and the XEPs an archive reads:
//! XEP-0059 result sets, XEP-0297 forwarding, XEP-0203 delays, XEP-0334
//! hints, XEP-0359 ids, XEP-0308 corrections, XEP-0424 retractions,
//! XEP-0333 markers) shared by the archive and the inbox.

use crate::{ns, BareJid, FullJid};
use starling_xml::Element;

/// XEP-0313 namespace.
pub const NS_MAM: &str = ns::MAM;
/// XEP-0059 namespace.
pub const NS_RSM: &str = "http://jabber.org/protocol/rsm";
/// XEP-0359 namespace.
pub const NS_SID: &str = "urn:xmpp:sid:0";
/// XEP-0424 namespace.
pub const NS_RETRACT: &str = "urn:xmpp:message-retract:1";
/// XEP-0308 namespace.
pub const NS_CORRECT: &str = "urn:xmpp:message-correct:0";
const NS_OMEMO: &str = "eu.siacs.conversations.axolotl";
const NS_OMEMO2: &str = "urn:xmpp:omemo:2";

/// How a message counts for the archive and the inbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Not archived.
    Skip,
    /// An instant message (has a body).
    Instant,
    /// A correction (XEP-0308) carrying the new body.
    Correction,
    /// Archived, but not a message a user reads (receipts, markers,
    /// retractions, bodiless encrypted payloads).
    Other,
}

/// Classifies `el` (XEP-0313 §5.1.1, XEP-0334).
pub fn classify(el: &Element) -> Kind {
    let t = el.attr("type").unwrap_or("normal");
    if !matches!(t, "chat" | "normal") {
        return Kind::Skip;
    }
    if el.has_child("no-store", ns::HINTS)
        || el.has_child("no-permanent-store", ns::HINTS)
        || el.has_child("received", ns::CARBONS)
        || el.has_child("sent", ns::CARBONS)
        || el.has_child("result", NS_MAM)
    {
        return Kind::Skip;
    }
    if el.has_child("retract", NS_RETRACT) {
        return Kind::Other;
    }
    if el.has_child("body", ns::CLIENT) {
        return if el.has_child("replace", NS_CORRECT) {
            Kind::Correction
        } else {
            Kind::Instant
        };
    }
    let other = el.children().any(|c| {
        c.is("store", ns::HINTS)
            || c.ns() == ns::CHAT_MARKERS
            || c.is("received", ns::RECEIPTS)
            || c.ns() == NS_OMEMO
            || c.ns() == NS_OMEMO2
    });
    if other {
        Kind::Other
    } else {
        Kind::Skip
    }
}

/// The sender-chosen id of a message: XEP-0359 origin-id, else `id`.
pub fn origin_id(el: &Element) -> Option<String> {
    el.get_child("origin-id", NS_SID)
        .and_then(|o| o.attr("id"))
        .or_else(|| el.attr("id"))
        .map(str::to_owned)
}

/// Adds RSM `<first/>` and `<last/>` (XEP-0059 §2.6) to `set` for a
/// non-empty page.
pub fn rsm_first_last(set: &mut Element, first: Option<String>, last: Option<String>) {
    if let (Some(f), Some(l)) = (first, last) {
        set.append_child(Element::builder("first", NS_RSM).text(f).build());
        set.append_child(Element::builder("last", NS_RSM).text(l).build());
    }
}

/// `<message><result queryid id><forwarded><delay stamp/>(stored)</forwarded></result></message>`
/// (XEP-0313 §5.1.2): `id` is the archive id as clients see it, `stamp`
/// its XEP-0082 time.
pub fn result_message(
    owner: &BareJid,
    to: &FullJid,
    queryid: Option<&str>,
    id: &str,
    stamp: &str,
    stored: Element,
) -> Element {
    let mut result = Element::builder("result", NS_MAM).attr("id", id);
    if let Some(q) = queryid {
        result = result.attr("queryid", q);
    }
    let forwarded = Element::builder("forwarded", ns::FORWARD)
        .append(
            Element::builder("delay", ns::DELAY)
                .attr("stamp", stamp)
                .build(),
        )
        .append(stored)
        .build();
    Element::builder("message", ns::CLIENT)
        .attr("from", owner.as_str())
        .attr("to", to.as_str())
        .append(result.append(forwarded).build())
        .build()
}
