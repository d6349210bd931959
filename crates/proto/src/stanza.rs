//! Stanzas: the element plus its routing attributes, parsed once at the edge.

use crate::{ns, StanzaError};
use jid::Jid;
use starling_xml::{Element, Node, Prepared};
use std::sync::Arc;

/// The three stanza kinds of RFC 6120 §8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StanzaKind {
    /// `<message/>`
    Message,
    /// `<presence/>`
    Presence,
    /// `<iq/>`
    Iq,
}

impl StanzaKind {
    /// The element name.
    pub fn as_str(self) -> &'static str {
        match self {
            StanzaKind::Message => "message",
            StanzaKind::Presence => "presence",
            StanzaKind::Iq => "iq",
        }
    }
}

/// Why an element could not be taken as a stanza.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StanzaParseError {
    /// Not `message`, `presence` or `iq` in the stream's content namespace
    /// (RFC 6120 §4.9.3.24 `unsupported-stanza-type`).
    #[error("unsupported stanza element {0}")]
    UnsupportedElement(String),
    /// The `to` attribute is not a valid JID (§8.3.3.8 `jid-malformed`).
    #[error("malformed 'to' address: {0}")]
    MalformedTo(String),
    /// The `from` attribute is not a valid JID.
    #[error("malformed 'from' address: {0}")]
    MalformedFrom(String),
    /// An iq without a valid `type` or `id` (RFC 6120 §8.2.3).
    #[error("iq stanza without valid type and id")]
    BadIq,
}

/// A stanza: routing attributes parsed and normalised once, the element kept
/// whole so that every payload is forwarded as received.
///
/// The `to`/`from` fields and the element's attributes are kept in sync by
/// the setters; read them through [`Stanza::to`] and [`Stanza::from`].
///
/// A stanza that goes to many recipients unchanged but for `to` (a room's
/// copies) can be [prepared](Stanza::prepare): serialised once, its clones
/// share the bytes, and the connection splices each copy's `to` in. Any
/// other change (the element mutably, `from`) drops the shared bytes.
#[derive(Clone, Debug)]
pub struct Stanza {
    kind: StanzaKind,
    to: Option<Jid>,
    from: Option<Jid>,
    el: Element,
    wire: Option<Arc<Prepared>>,
}

impl PartialEq for Stanza {
    fn eq(&self, other: &Self) -> bool {
        // The shared bytes are a cache of `el`.
        self.kind == other.kind
            && self.to == other.to
            && self.from == other.from
            && self.el == other.el
    }
}

impl Eq for Stanza {}

impl Stanza {
    /// A server-generated `<presence/>` of type `kind` (none: available).
    pub fn presence(kind: Option<&str>, from: Jid, to: Jid) -> Stanza {
        let mut el = Element::new("presence", ns::CLIENT);
        if let Some(t) = kind {
            el.set_attr("type", t);
        }
        Stanza::new(el, Some(from), Some(to))
    }

    /// The `<priority/>` of a presence (RFC 6121 §4.7.2.3): an integer
    /// clamped to -128..=127, 0 when absent or malformed.
    pub fn priority(&self) -> i8 {
        self.element()
            .get_child("priority", ns::CLIENT)
            .and_then(|p| p.text().trim().parse::<i64>().ok())
            .map(|p| p.clamp(-128, 127) as i8)
            .unwrap_or(0)
    }

    /// Takes a top-level element received on a `jabber:client` stream.
    pub fn from_element(el: Element) -> Result<Stanza, StanzaParseError> {
        Self::from_element_in(el, ns::CLIENT)
    }

    /// Takes a top-level element received on a stream whose content
    /// namespace is `content_ns`.
    pub fn from_element_in(mut el: Element, content_ns: &str) -> Result<Stanza, StanzaParseError> {
        if el.ns() != content_ns {
            return Err(StanzaParseError::UnsupportedElement(format!(
                "{{{}}}{}",
                el.ns(),
                el.name()
            )));
        }
        let kind = match el.name() {
            "message" => StanzaKind::Message,
            "presence" => StanzaKind::Presence,
            "iq" => StanzaKind::Iq,
            other => return Err(StanzaParseError::UnsupportedElement(other.to_string())),
        };
        let to = parse_jid_attr(&mut el, "to").map_err(StanzaParseError::MalformedTo)?;
        let from = parse_jid_attr(&mut el, "from").map_err(StanzaParseError::MalformedFrom)?;
        let stanza = Stanza {
            kind,
            to,
            from,
            el,
            wire: None,
        };
        if kind == StanzaKind::Iq
            && (stanza.id().is_none()
                || !matches!(stanza.type_attr(), Some("get" | "set" | "result" | "error")))
        {
            return Err(StanzaParseError::BadIq);
        }
        Ok(stanza)
    }

    /// Builds a stanza from parts the server itself generated.
    ///
    /// # Panics
    /// In debug builds, if `el` is not a stanza element; callers build these
    /// elements themselves, so this is a programming error, not input.
    pub fn new(el: Element, from: Option<Jid>, to: Option<Jid>) -> Stanza {
        let kind = match el.name() {
            "message" => StanzaKind::Message,
            "presence" => StanzaKind::Presence,
            _ => {
                debug_assert_eq!(el.name(), "iq", "Stanza::new with a non-stanza element");
                StanzaKind::Iq
            }
        };
        let mut s = Stanza {
            kind,
            to: None,
            from: None,
            el,
            wire: None,
        };
        s.set_from(from);
        s.set_to(to);
        s
    }

    /// The stanza kind.
    pub fn kind(&self) -> StanzaKind {
        self.kind
    }

    /// The normalised `to` address.
    pub fn to(&self) -> Option<&Jid> {
        self.to.as_ref()
    }

    /// The normalised `from` address.
    pub fn from(&self) -> Option<&Jid> {
        self.from.as_ref()
    }

    /// Sets (or removes) the `to` address.
    pub fn set_to(&mut self, to: Option<Jid>) {
        match &to {
            Some(j) => self.el.set_attr("to", j.as_str()),
            None => {
                self.el.remove_attr("to");
            }
        }
        self.to = to;
    }

    /// Sets (or removes) the `from` address.
    pub fn set_from(&mut self, from: Option<Jid>) {
        self.wire = None;
        match &from {
            Some(j) => self.el.set_attr("from", j.as_str()),
            None => {
                self.el.remove_attr("from");
            }
        }
        self.from = from;
    }

    /// The `id` attribute.
    pub fn id(&self) -> Option<&str> {
        self.el.attr("id")
    }

    /// The raw `type` attribute, if present.
    pub fn type_attr(&self) -> Option<&str> {
        self.el.attr("type")
    }

    /// The effective type: for messages an absent type means `normal`
    /// (RFC 6121 §5.2.2), for presence it means `available` (returned as "").
    pub fn stanza_type(&self) -> &str {
        match (self.kind, self.el.attr("type")) {
            (_, Some(t)) => t,
            (StanzaKind::Message, None) => "normal",
            _ => "",
        }
    }

    /// True for an error stanza (never answered with an error, §8.3.1).
    pub fn is_error(&self) -> bool {
        self.type_attr() == Some("error")
    }

    /// True for an iq of type get or set.
    pub fn is_iq_request(&self) -> bool {
        self.kind == StanzaKind::Iq && matches!(self.type_attr(), Some("get" | "set"))
    }

    /// The first child element: an iq's payload.
    pub fn payload(&self) -> Option<&Element> {
        self.el.children().next()
    }

    /// The element.
    pub fn element(&self) -> &Element {
        &self.el
    }

    /// The element, mutably. Do not change `to`/`from` through it; use the
    /// setters so the parsed addresses stay in sync.
    pub fn element_mut(&mut self) -> &mut Element {
        self.wire = None;
        &mut self.el
    }

    /// Serialises the stanza once for copies that will differ only in
    /// `to` ([`Stanza::set_to`] keeps the shared bytes, every other change
    /// drops them).
    pub fn prepare(&mut self) {
        self.wire = Some(Arc::new(self.el.prepare("to")));
    }

    /// The shared serialisation, if the stanza is prepared and unchanged
    /// but for `to`: write it with [`Prepared::write_to`] and the `to`
    /// attribute's value.
    pub fn prepared(&self) -> Option<&Prepared> {
        self.wire.as_deref()
    }

    /// Consumes the stanza into its element.
    pub fn into_element(self) -> Element {
        self.el
    }

    /// The error reply to this stanza (RFC 6120 §8.3.1), addressed back to
    /// its sender and from its intended recipient. `None` if this stanza is
    /// itself an error, which must never be answered with an error.
    pub fn error_reply(&self, error: StanzaError) -> Option<Stanza> {
        if self.is_error() {
            return None;
        }
        let mut el = Element::new(self.kind.as_str(), ns::CLIENT);
        if let Some(id) = self.id() {
            el.set_attr("id", id);
        }
        el.set_attr("type", "error");
        // §8.3.1: the original payload MAY be included; iq errors carry the
        // request's payload so the requester can match it, other kinds carry
        // their children as well.
        for node in self.el.nodes() {
            if let Node::Element(child) = node {
                el.append_child(child.clone());
            }
        }
        el.append_child(error.to_element());
        Some(Stanza::new(el, self.to.clone(), self.from.clone()))
    }

    /// The `result` reply to an iq get/set, with an optional payload.
    pub fn iq_result(&self, payload: Option<Element>) -> Stanza {
        let mut el = Element::new("iq", ns::CLIENT);
        if let Some(id) = self.id() {
            el.set_attr("id", id);
        }
        el.set_attr("type", "result");
        if let Some(p) = payload {
            el.append_child(p);
        }
        Stanza::new(el, self.to.clone(), self.from.clone())
    }
}

fn parse_jid_attr(el: &mut Element, name: &str) -> Result<Option<Jid>, String> {
    let Some(raw) = el.attr(name) else {
        return Ok(None);
    };
    match Jid::new(raw) {
        Ok(j) => {
            if j.as_str() != raw {
                let norm = j.as_str().to_owned();
                el.set_attr(name, norm);
            }
            Ok(Some(j))
        }
        Err(e) => Err(format!("{raw}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StanzaErrorCondition;

    fn el(xml_name: &str) -> Element {
        Element::new(xml_name, ns::CLIENT)
    }

    #[test]
    fn from_element_normalises_addresses() {
        let mut m = el("message");
        m.set_attr("to", "Juliet@Capulet.LIT/Balcony");
        let s = Stanza::from_element(m).unwrap();
        assert_eq!(s.to().unwrap().as_str(), "juliet@capulet.lit/Balcony");
        assert_eq!(s.element().attr("to"), Some("juliet@capulet.lit/Balcony"));
    }

    #[test]
    fn from_element_bad_to_is_malformed() {
        let mut m = el("message");
        m.set_attr("to", "a@b@c");
        assert!(matches!(
            Stanza::from_element(m),
            Err(StanzaParseError::MalformedTo(_))
        ));
    }

    #[test]
    fn from_element_unknown_is_unsupported() {
        assert!(matches!(
            Stanza::from_element(el("foo")),
            Err(StanzaParseError::UnsupportedElement(_))
        ));
    }

    #[test]
    fn iq_without_id_is_bad() {
        // RFC 6120 §8.2.3: iq MUST have id and type.
        let mut iq = el("iq");
        iq.set_attr("type", "get");
        assert_eq!(Stanza::from_element(iq), Err(StanzaParseError::BadIq));
    }

    #[test]
    fn error_reply_swaps_addresses_and_never_answers_errors() {
        let mut m = el("message");
        m.set_attr("to", "b@x");
        m.set_attr("from", "a@x/r");
        m.set_attr("id", "1");
        let s = Stanza::from_element(m).unwrap();
        let e = s
            .error_reply(StanzaErrorCondition::ServiceUnavailable.into())
            .unwrap();
        assert_eq!(e.to().unwrap().as_str(), "a@x/r");
        assert_eq!(e.from().unwrap().as_str(), "b@x");
        assert!(e.is_error());
        assert!(e
            .error_reply(StanzaErrorCondition::BadRequest.into())
            .is_none());
    }

    #[test]
    fn a_prepared_stanza_keeps_its_bytes_across_to_and_drops_them_on_any_other_change() {
        let mut m = el("message");
        m.set_attr("type", "groupchat");
        m.append_child(Element::builder("body", ns::CLIENT).text("hi").build());
        let mut t = Stanza::new(m, Some(Jid::new("r@c.x/n").unwrap()), None);
        assert!(t.prepared().is_none());
        t.prepare();
        let mut copy = t.clone();
        copy.set_to(Some(Jid::new("u@x/r").unwrap()));
        let wire = copy.prepared().expect("to is spliced in");
        let (mut got, mut want) = (Vec::new(), Vec::new());
        wire.write_to(&mut got, ns::CLIENT, copy.element().attr("to"));
        copy.element().write_to(&mut want, ns::CLIENT);
        assert_eq!(got.len(), want.len());
        assert!(String::from_utf8(got).unwrap().contains(" to='u@x/r'"));
        assert_eq!(copy, {
            let mut c = copy.clone();
            c.wire = None;
            c
        });
        let mut changed = copy.clone();
        changed.element_mut().set_attr("id", "x");
        assert!(changed.prepared().is_none());
        let mut changed = copy.clone();
        changed.set_from(None);
        assert!(changed.prepared().is_none());
    }
}
