//! XML namespaces used by the core protocol and by built-in modules.

/// RFC 6120 §4.8.2: content namespace of client-to-server streams.
pub const CLIENT: &str = "jabber:client";
/// RFC 6120 §4.8.1: the stream namespace.
pub const STREAMS: &str = starling_xml::NS_STREAMS;
/// RFC 6120 §4.9.2: stream error conditions.
pub const STREAM_ERRORS: &str = "urn:ietf:params:xml:ns:xmpp-streams";
/// RFC 6120 §8.3.2: stanza error conditions.
pub const STANZAS: &str = "urn:ietf:params:xml:ns:xmpp-stanzas";
/// RFC 6120 §5: STARTTLS.
pub const TLS: &str = "urn:ietf:params:xml:ns:xmpp-tls";
/// RFC 6120 §6: SASL.
pub const SASL: &str = "urn:ietf:params:xml:ns:xmpp-sasl";
/// RFC 6120 §7: resource binding.
pub const BIND: &str = "urn:ietf:params:xml:ns:xmpp-bind";
/// RFC 3921 §3 / draft-cridland-xmpp-session: legacy session establishment.
pub const SESSION: &str = "urn:ietf:params:xml:ns:xmpp-session";
/// XEP-0388: Extensible SASL Profile (SASL2).
pub const SASL2: &str = "urn:xmpp:sasl:2";
/// XEP-0386: Bind 2.
pub const BIND2: &str = "urn:xmpp:bind:0";
/// XEP-0440: SASL channel-binding type capability.
pub const SASL_CB: &str = "urn:xmpp:sasl-cb:0";
/// XEP-0199: XMPP Ping.
pub const PING: &str = "urn:xmpp:ping";
/// XEP-0030: service discovery, info.
pub const DISCO_INFO: &str = "http://jabber.org/protocol/disco#info";
/// XEP-0030: service discovery, items.
pub const DISCO_ITEMS: &str = "http://jabber.org/protocol/disco#items";
/// XEP-0077: in-band registration (iq payload).
pub const REGISTER: &str = "jabber:iq:register";
/// XEP-0077: in-band registration stream feature.
pub const REGISTER_FEATURE: &str = "http://jabber.org/features/iq-register";
/// XEP-0004: data forms.
pub const DATA_FORMS: &str = "jabber:x:data";
/// XEP-0066: out of band data (used in registration instructions).
pub const OOB: &str = "jabber:x:oob";
/// RFC 7395 §3.3.2: the framing namespace of XMPP over WebSocket (`<open/>`, `<close/>`).
pub const FRAMING: &str = "urn:ietf:params:xml:ns:xmpp-framing";
/// XEP-0203: delayed delivery.
pub const DELAY: &str = "urn:xmpp:delay";
/// XEP-0297: stanza forwarding.
pub const FORWARD: &str = "urn:xmpp:forward:0";
/// XEP-0280: message carbons.
pub const CARBONS: &str = "urn:xmpp:carbons:2";
/// XEP-0334: message processing hints.
pub const HINTS: &str = "urn:xmpp:hints";
/// XEP-0184: message delivery receipts.
pub const RECEIPTS: &str = "urn:xmpp:receipts";
/// XEP-0333: chat markers.
pub const CHAT_MARKERS: &str = "urn:xmpp:chat-markers:0";
/// XEP-0313: message archive management.
pub const MAM: &str = "urn:xmpp:mam:2";
/// XEP-0359 unique and stable stanza ids.
pub const SID: &str = "urn:xmpp:sid:0";
