//! Stanza builders for scenario tests whose point is not the XML itself:
//! a message, an iq or a presence said in a line, attribute values and
//! text escaped (RFC 6120 §11.1), namespaces left to the stream's
//! default (`jabber:client`).
//!
//! ```
//! use starling_testkit::stanza::{empty, iq_get, iq_set, msg, presence};
//! assert_eq!(
//!     msg("bob@localhost").chat().id("m1").body("hi & bye").to_string(),
//!     "<message to='bob@localhost' type='chat' id='m1'><body>hi &amp; bye</body></message>"
//! );
//! assert_eq!(
//!     iq_get("localhost", "p1", "<ping xmlns='urn:xmpp:ping'/>"),
//!     "<iq type='get' id='p1' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>"
//! );
//! assert_eq!(
//!     iq_set("", "s1", &empty("enable", "urn:xmpp:carbons:2")),
//!     "<iq type='set' id='s1'><enable xmlns='urn:xmpp:carbons:2'/></iq>"
//! );
//! assert_eq!(presence().to("room@conference.localhost/me").to_string(),
//!     "<presence to='room@conference.localhost/me'/>");
//! ```
//!
//! Tests of the protocol's bytes (stream negotiation, bad input, framing)
//! keep their literal XML.

use std::fmt;

/// `s` with `&`, `<`, `>`, `'` and `"` escaped, for text and attribute
/// values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// A stanza being built: its name, attributes in order, and content.
#[derive(Clone, Debug)]
pub struct Stanza {
    name: &'static str,
    attrs: Vec<(&'static str, String)>,
    content: String,
}

impl Stanza {
    fn new(name: &'static str) -> Stanza {
        Stanza {
            name,
            attrs: Vec::new(),
            content: String::new(),
        }
    }

    /// Sets attribute `name` (replacing an earlier value).
    pub fn attr(mut self, name: &'static str, value: &str) -> Stanza {
        self.attrs.retain(|(n, _)| *n != name);
        self.attrs.push((name, value.to_owned()));
        self
    }

    /// `to`.
    pub fn to(self, jid: &str) -> Stanza {
        self.attr("to", jid)
    }

    /// `id`.
    pub fn id(self, id: &str) -> Stanza {
        self.attr("id", id)
    }

    /// `type`.
    pub fn ty(self, ty: &str) -> Stanza {
        self.attr("type", ty)
    }

    /// `type='chat'` (RFC 6121 §5.2.2).
    pub fn chat(self) -> Stanza {
        self.ty("chat")
    }

    /// `type='groupchat'` (XEP-0045 §7.4).
    pub fn groupchat(self) -> Stanza {
        self.ty("groupchat")
    }

    /// `type='headline'`.
    pub fn headline(self) -> Stanza {
        self.ty("headline")
    }

    /// `type='normal'`.
    pub fn normal(self) -> Stanza {
        self.ty("normal")
    }

    /// A `<body/>` with `text` (escaped).
    pub fn body(self, text: &str) -> Stanza {
        self.text_child("body", text)
    }

    /// A `<show/>` (RFC 6121 §4.7.2.1: away, chat, dnd, xa).
    pub fn show(self, show: &str) -> Stanza {
        self.text_child("show", show)
    }

    /// A `<status/>` with `text` (escaped).
    pub fn status(self, text: &str) -> Stanza {
        self.text_child("status", text)
    }

    /// A `<priority/>` (RFC 6121 §4.7.2.3).
    pub fn priority(self, p: i8) -> Stanza {
        self.text_child("priority", &p.to_string())
    }

    /// A child given as XML, as is (an extension element).
    pub fn child(mut self, xml: &str) -> Stanza {
        self.content.push_str(xml);
        self
    }

    fn text_child(mut self, name: &str, text: &str) -> Stanza {
        self.content
            .push_str(&format!("<{name}>{}</{name}>", escape(text)));
        self
    }
}

impl fmt::Display for Stanza {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{}", self.name)?;
        for (n, v) in &self.attrs {
            write!(f, " {n}='{}'", escape(v))?;
        }
        if self.content.is_empty() {
            write!(f, "/>")
        } else {
            write!(f, ">{}</{}>", self.content, self.name)
        }
    }
}

/// A `<message/>` to `to`; add its type, id, body, children.
pub fn msg(to: &str) -> Stanza {
    Stanza::new("message").to(to)
}

/// A `<presence/>`; add what it needs.
pub fn presence() -> Stanza {
    Stanza::new("presence")
}

/// An `<iq/>` of type `ty` with `id` (RFC 6120 §8.2.3); add `to` and its
/// payload ([`Stanza::child`]).
pub fn iq(ty: &str, id: &str) -> Stanza {
    Stanza::new("iq").ty(ty).id(id)
}

/// A childless element `<name xmlns='xmlns'/>`: the payload of many a
/// get or set (`empty("prefs", MAM)`), where the element alone is asked.
pub fn empty(name: &str, xmlns: &str) -> String {
    format!("<{name} xmlns='{}'/>", escape(xmlns))
}

/// An iq get with `payload` to `to` (empty: no `to`, the own account).
pub fn iq_get(to: &str, id: &str, payload: &str) -> String {
    with_to(iq("get", id), to).child(payload).to_string()
}

/// An iq set with `payload` to `to` (empty: no `to`, the own account).
pub fn iq_set(to: &str, id: &str, payload: &str) -> String {
    with_to(iq("set", id), to).child(payload).to_string()
}

/// `<query xmlns='…'>inner</query>` (`inner` as is; empty: a self-closed
/// `<query/>`), the payload of many iq namespaces (disco, MAM, MUC admin
/// and owner, MUC Light), to go in [`iq_get`] or [`iq_set`].
///
/// ```
/// use starling_testkit::stanza::{iq_get, query};
/// assert_eq!(query("jabber:iq:roster", ""), "<query xmlns='jabber:iq:roster'/>");
/// assert_eq!(
///     iq_get("", "v1", &query("jabber:iq:version", "<name/>")),
///     "<iq type='get' id='v1'><query xmlns='jabber:iq:version'><name/></query></iq>"
/// );
/// ```
pub fn query(xmlns: &str, inner: &str) -> String {
    Stanza::new("query")
        .attr("xmlns", xmlns)
        .child(inner)
        .to_string()
}

fn with_to(s: Stanza, to: &str) -> Stanza {
    if to.is_empty() {
        s
    } else {
        s.to(to)
    }
}
