//! What the `pep` scenario says and reads: namespaces, the nodes and their
//! items, XEP-0115 capabilities and the disco#info answer, the fan-out item
//! ids, notifications told apart from the rest, reading the next element.

use crate::client::{Conn, Event, READ_CHUNK};
use crate::rate::SplitMix;
use crate::rooms::Failure;
use crate::{client, engine};
use base64::Engine as _;
use starling_xml::Element;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;

/// XEP-0060.
pub const NS_PUBSUB: &str = "http://jabber.org/protocol/pubsub";
/// XEP-0060 owner use cases.
pub const NS_PUBSUB_OWNER: &str = "http://jabber.org/protocol/pubsub#owner";
/// XEP-0060 notifications.
pub const NS_EVENT: &str = "http://jabber.org/protocol/pubsub#event";
/// XEP-0115.
pub const NS_CAPS: &str = "http://jabber.org/protocol/caps";
/// XEP-0030.
pub const NS_DISCO_INFO: &str = "http://jabber.org/protocol/disco#info";
/// RFC 6121 rosters.
pub const NS_ROSTER: &str = "jabber:iq:roster";
const NS_FRAMING: &str = "urn:ietf:params:xml:ns:xmpp-framing";
const NS_STREAMS: &str = "http://etherx.jabber.org/streams";
/// The `node` of the bench's capabilities (XEP-0115 §4: the software's URI).
pub const CAPS_NODE: &str = "https://example.invalid/starling/bench";
/// The bench client's disco identity: category, type, xml:lang, name.
const IDENTITY: [&str; 4] = ["client", "pc", "", "starling-bench"];
/// The bench client's features besides the `+notify` ones.
const BASE_FEATURES: [&str; 3] = [NS_CAPS, NS_DISCO_INFO, "urn:xmpp:ping"];

/// A PEP node the users publish to.
#[derive(Clone, Copy, Debug)]
pub struct PepNode {
    /// The node name.
    pub node: &'static str,
    /// Published with `publish-options` access model `open` (OMEMO device
    /// lists); else the server's default (`presence`).
    pub open: bool,
}

/// The nodes, in `--nodes` order: what a modern client publishes.
pub const NODES: [PepNode; 8] = [
    PepNode {
        node: "urn:xmpp:avatar:metadata",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/nick",
        open: false,
    },
    PepNode {
        node: "eu.siacs.conversations.axolotl.devicelist",
        open: true,
    },
    PepNode {
        node: "urn:xmpp:omemo:2:devices",
        open: true,
    },
    PepNode {
        node: "http://jabber.org/protocol/mood",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/activity",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/tune",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/geoloc",
        open: false,
    },
];

/// The item user `n` publishes to node `k` of [`NODES`]: (id, payload).
pub(super) fn item(k: usize, n: u64) -> (String, String) {
    let mut rng = SplitMix::new(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k as u64 + 1));
    let mut hex = || -> String {
        (0..5)
            .map(|_| format!("{:08x}", rng.next_u64() as u32))
            .collect()
    };
    let (a, b) = (hex(), hex());
    let device = |s: &str| u32::from_str_radix(&s[..8], 16).unwrap_or(1) & 0x7fff_ffff;
    let (d1, d2, d3) = (device(&a), device(&b), device(&a[8..]));
    let current = "current".to_owned();
    match k {
        0 => (
            a.clone(),
            format!(
                "<metadata xmlns='urn:xmpp:avatar:metadata'>\
                 <info bytes='{}' height='192' id='{a}' type='image/png' width='192'/>\
                 <info bytes='{}' height='64' id='{b}' type='image/webp' width='64' \
                 url='https://example.invalid/avatars/{b}.webp'/></metadata>",
                20_000 + n % 10_000,
                3_000 + n % 1_000
            ),
        ),
        1 => (
            current,
            format!("<nick xmlns='http://jabber.org/protocol/nick'>Bench user {n}</nick>"),
        ),
        2 => (
            current,
            format!(
                "<list xmlns='eu.siacs.conversations.axolotl'><device id='{d1}'/>\
                 <device id='{d2}'/><device id='{d3}'/></list>"
            ),
        ),
        3 => (
            current,
            format!(
                "<devices xmlns='urn:xmpp:omemo:2'><device id='{d1}' label='Phone'/>\
                 <device id='{d2}' label='Laptop'/><device id='{d3}' label='Desktop'/></devices>"
            ),
        ),
        4 => (
            current,
            "<mood xmlns='http://jabber.org/protocol/mood'><happy/>\
             <text>Measuring logins with many contacts</text></mood>"
                .to_owned(),
        ),
        5 => (
            current,
            "<activity xmlns='http://jabber.org/protocol/activity'><working><coding/></working>\
             <text>Benchmarking personal eventing</text></activity>"
                .to_owned(),
        ),
        6 => (
            current,
            format!(
                "<tune xmlns='http://jabber.org/protocol/tune'><artist>Yes</artist>\
                 <length>686</length><rating>8</rating><source>Yessongs</source>\
                 <title>Heart of the Sunrise</title><track>{}</track>\
                 <uri>https://example.invalid/tunes/{a}</uri></tune>",
                1 + n % 12
            ),
        ),
        _ => (
            current,
            format!(
                "<geoloc xmlns='http://jabber.org/protocol/geoloc'><accuracy>20</accuracy>\
                 <country>Italy</country><lat>45.{:04}</lat><locality>Venice</locality>\
                 <lon>12.{:04}</lon><timestamp>2026-11-26T12:00:00Z</timestamp></geoloc>",
                n % 10_000,
                (n * 7) % 10_000
            ),
        ),
    }
}

/// The publish iq of user `n`'s item on node `k`, with id `id`.
pub(super) fn publish_iq(k: usize, n: u64, id: &str) -> String {
    let (item_id, payload) = item(k, n);
    publish_item_iq(k, &item_id, &payload, id)
}

/// The publish iq of `payload` as item `item_id` on node `k`, with id `id`.
pub(super) fn publish_item_iq(k: usize, item_id: &str, payload: &str, id: &str) -> String {
    let options = if NODES[k].open {
        "<publish-options><x xmlns='jabber:x:data' type='submit'>\
         <field var='FORM_TYPE' type='hidden'>\
         <value>http://jabber.org/protocol/pubsub#publish-options</value></field>\
         <field var='pubsub#access_model'><value>open</value></field></x></publish-options>"
    } else {
        ""
    };
    format!(
        "<iq type='set' id='{id}'><pubsub xmlns='{NS_PUBSUB}'><publish node='{}'>\
         <item id='{item_id}'>{payload}</item></publish>{options}</pubsub></iq>",
        NODES[k].node
    )
}

// ----- XEP-0115 -----

/// SHA-1 for the caps hash (XEP-0115 §5.1 uses it).
fn sha1(data: &[u8]) -> [u8; 20] {
    use sha1::Digest;
    sha1::Sha1::digest(data).into()
}

/// The XEP-0115 §5.1 verification string of identities (category, type,
/// xml:lang, name) and features (no extended forms): each identity
/// `category/type/lang/name<`, sorted, then each feature `var<`, sorted.
pub fn verification_string(identities: &[[&str; 4]], features: &[&str]) -> String {
    let mut ids: Vec<String> = identities.iter().map(|i| i.join("/")).collect();
    ids.sort();
    let mut fs: Vec<&str> = features.to_vec();
    fs.sort_unstable();
    let mut s = String::new();
    for x in ids.iter().map(String::as_str).chain(fs) {
        s.push_str(x);
        s.push('<');
    }
    s
}

/// The `ver` of [`verification_string`]: base64 of its SHA-1 (§5.1 steps
/// 9–10, hash `sha-1`).
pub fn caps_ver(identities: &[[&str; 4]], features: &[&str]) -> String {
    let s = verification_string(identities, features);
    base64::engine::general_purpose::STANDARD.encode(sha1(s.as_bytes()))
}

/// The capabilities every bench session announces.
#[derive(Clone, Debug)]
pub struct Caps {
    /// The features: `caps`, `disco#info`, `urn:xmpp:ping` and `NODE+notify` per node.
    pub features: Vec<String>,
    /// Their `ver`.
    pub ver: String,
}

impl Caps {
    /// For the published `nodes`.
    pub fn new(nodes: &[PepNode]) -> Caps {
        let mut features: Vec<String> = BASE_FEATURES.iter().map(|f| f.to_string()).collect();
        features.extend(nodes.iter().map(|n| format!("{}+notify", n.node)));
        let refs: Vec<&str> = features.iter().map(String::as_str).collect();
        let ver = caps_ver(&[IDENTITY], &refs);
        Caps { features, ver }
    }

    /// Available presence with the capabilities (§4).
    pub fn presence(&self) -> String {
        format!(
            "<presence><c xmlns='{NS_CAPS}' hash='sha-1' node='{CAPS_NODE}' ver='{}'/></presence>",
            self.ver
        )
    }

    /// The disco#info result for a query with id `id` from `to`, for
    /// `node` (echoed as asked, §6.3).
    pub fn disco_result(&self, id: &str, to: Option<&str>, node: Option<&str>) -> String {
        let esc = client::xml_escape;
        let to = to.map(|t| format!(" to='{}'", esc(t))).unwrap_or_default();
        let node = node
            .map(|n| format!(" node='{}'", esc(n)))
            .unwrap_or_default();
        let [category, kind, _, name] = IDENTITY;
        let features: String = self
            .features
            .iter()
            .map(|f| format!("<feature var='{}'/>", esc(f)))
            .collect();
        format!(
            "<iq type='result' id='{}'{to}><query xmlns='{NS_DISCO_INFO}'{node}>\
             <identity category='{category}' type='{kind}' name='{name}'/>{features}</query></iq>",
            esc(id)
        )
    }
}

/// The answer to an iq the server sent (`get`/`set`): our disco#info
/// (`true`: it was one), a result for a roster push, the engine's answer
/// otherwise (pings). `None` for results and errors.
pub(super) fn answer_iq(el: &Element, caps: &Caps) -> Option<(String, bool)> {
    if el.name() != "iq" || !matches!(el.attr("type"), Some("get") | Some("set")) {
        return None;
    }
    let id = el.attr("id").unwrap_or("");
    if el.attr("type") == Some("get") {
        if let Some(q) = el.get_child("query", NS_DISCO_INFO) {
            return Some((caps.disco_result(id, el.attr("from"), q.attr("node")), true));
        }
    }
    if el.attr("type") == Some("set") && el.has_child("query", NS_ROSTER) {
        return Some((
            format!("<iq type='result' id='{}'/>", client::xml_escape(id)),
            false,
        ));
    }
    engine::iq_reply(el).map(|r| (r, false))
}

/// The item id of fan-out publication `i`, sent at `send_us` (µs since
/// the epoch).
pub(super) fn fan_item_id(send_us: u64, i: u64) -> String {
    format!("fan-{send_us}-{i}")
}

/// Inverse of [`fan_item_id`]: (send time, publication).
pub(super) fn parse_fan_id(id: &str) -> Option<(u64, u64)> {
    let (send, i) = id.strip_prefix("fan-")?.split_once('-')?;
    Some((send.parse().ok()?, i.parse().ok()?))
}

/// The id of the first item of notification `el`, if any.
pub(super) fn notified_item_id(el: &Element) -> Option<&str> {
    el.get_child("event", NS_EVENT)?
        .get_child("items", NS_EVENT)?
        .get_child("item", NS_EVENT)?
        .attr("id")
}

/// A bare JID, lower-cased.
pub(super) fn bare(jid: &str) -> String {
    jid.split('/').next().unwrap_or(jid).to_ascii_lowercase()
}

/// If `el` is a PEP notification: (publisher's bare JID, node).
pub(super) fn notification(el: &Element) -> Option<(String, String)> {
    if el.name() != "message" || el.attr("type") == Some("error") {
        return None;
    }
    let event = el.get_child("event", NS_EVENT)?;
    let node = event.children().find_map(|c| c.attr("node")).unwrap_or("");
    Some((bare(el.attr("from").unwrap_or("")), node.to_owned()))
}

// ----- reading -----

/// What [`next_element`] got.
pub(super) enum Next {
    El(Element),
    Timeout,
    Closed,
}

/// The next element from the server, counting the bytes read into
/// `bytes`; `Timeout` at `deadline`.
pub(super) async fn next_element(
    conn: &mut Conn,
    bytes: &mut u64,
    deadline: Option<tokio::time::Instant>,
) -> Next {
    let mut buf = [0u8; READ_CHUNK];
    loop {
        match conn.inbound.parse_pending() {
            Ok(Some(Event::Element(el))) => {
                if el.ns() == NS_FRAMING {
                    if el.name() == "close" {
                        return Next::Closed;
                    }
                    continue;
                }
                if el.is("error", NS_STREAMS) {
                    return Next::Closed;
                }
                return Next::El(el);
            }
            Ok(Some(Event::Header)) => continue,
            Ok(Some(Event::Closed)) | Err(_) => return Next::Closed,
            Ok(None) => {}
        }
        let read = conn.io.read(&mut buf);
        let r = match deadline {
            Some(d) => match tokio::time::timeout_at(d, read).await {
                Err(_) => return Next::Timeout,
                Ok(r) => r,
            },
            None => read.await,
        };
        match r {
            Ok(0) | Err(_) => return Next::Closed,
            Ok(n) => {
                *bytes += n as u64;
                conn.inbound.feed(&buf[..n]);
            }
        }
    }
}

/// Sends `</stream:stream>` and reads until the server closes (3 s at most).
pub(super) async fn close(mut conn: Conn) {
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        let _ = conn.send(b"</stream:stream>").await;
        let mut sink = 0;
        while !matches!(next_element(&mut conn, &mut sink, None).await, Next::Closed) {}
    })
    .await;
}

pub(super) fn closed() -> Failure {
    ("closed".into(), "the server closed the session".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rooms::test_util::parse;

    #[test]
    fn sha1_matches_the_fips_vectors() {
        let hex = |d: [u8; 20]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(
            hex(sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex(sha1(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        assert_eq!(
            hex(sha1(&[b'a'; 1_000_000])),
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
    }

    /// XEP-0115 §5.2: the simple example.
    #[test]
    fn caps_hash_of_the_xep_example() {
        let ids = [["client", "pc", "", "Exodus 0.9.1"]];
        let features = [
            "http://jabber.org/protocol/disco#info",
            "http://jabber.org/protocol/disco#items",
            "http://jabber.org/protocol/muc",
            "http://jabber.org/protocol/caps",
        ];
        assert_eq!(
            verification_string(&ids, &features),
            "client/pc//Exodus 0.9.1<http://jabber.org/protocol/caps<\
             http://jabber.org/protocol/disco#info<http://jabber.org/protocol/disco#items<\
             http://jabber.org/protocol/muc<"
        );
        assert_eq!(caps_ver(&ids, &features), "QgayPKawpkPSDYmwT/WM94uAlu0=");
    }

    /// The disco#info answer hashes to the announced `ver`, as a server
    /// recomputes it (§5.4), and carries every node's `+notify`.
    #[test]
    fn disco_answer_matches_the_announced_ver() {
        let caps = Caps::new(&NODES[..3]);
        let presence = parse(&caps.presence());
        let c = presence.get_child("c", NS_CAPS).unwrap();
        assert_eq!(c.attr("hash"), Some("sha-1"));
        assert_eq!(c.attr("ver"), Some(caps.ver.as_str()));
        let node = format!("{CAPS_NODE}#{}", caps.ver);
        let q = parse(&format!(
            "<iq xmlns='jabber:client' type='get' id='caps-1' from='localhost' to='user1@localhost/bench'>\
             <query xmlns='{NS_DISCO_INFO}' node='{node}'/></iq>"
        ));
        let (answer, disco) = answer_iq(&q, &caps).unwrap();
        assert!(disco);
        let iq = parse(&answer);
        assert_eq!(iq.attr("type"), Some("result"));
        assert_eq!(iq.attr("id"), Some("caps-1"));
        assert_eq!(iq.attr("to"), Some("localhost"));
        let query = iq.get_child("query", NS_DISCO_INFO).unwrap();
        assert_eq!(query.attr("node"), Some(node.as_str()));
        let ids: Vec<[String; 4]> = query
            .children()
            .filter(|c| c.name() == "identity")
            .map(|i| {
                ["category", "type", "xml:lang", "name"].map(|k| i.attr(k).unwrap_or("").to_owned())
            })
            .collect();
        let features: Vec<&str> = query
            .children()
            .filter(|c| c.name() == "feature")
            .filter_map(|f| f.attr("var"))
            .collect();
        let ids: Vec<[&str; 4]> = ids
            .iter()
            .map(|i| [&*i[0], &*i[1], &*i[2], &*i[3]])
            .collect();
        assert_eq!(caps_ver(&ids, &features), caps.ver);
        for n in &NODES[..3] {
            assert!(features.contains(&format!("{}+notify", n.node).as_str()));
        }
        assert!(!features.contains(&"http://jabber.org/protocol/mood+notify"));
        assert_ne!(Caps::new(&NODES[..2]).ver, caps.ver, "a ver per node set");
    }

    #[test]
    fn fan_out_items_carry_their_send_time() {
        let id = fan_item_id(1_764_000_000_123_456, 7);
        assert_eq!(id, "fan-1764000000123456-7");
        assert_eq!(parse_fan_id(&id), Some((1_764_000_000_123_456, 7)));
        for bad in [
            "",
            "fan-",
            "fan-12",
            "fan-x-1",
            "fan-1-",
            "fan--1",
            "ab12cd",
            "fan-1-2-3",
        ] {
            assert_eq!(parse_fan_id(bad), None, "{bad}");
        }
        let iq = publish_item_iq(0, &id, "<x/>", "fan-pub-7");
        assert!(iq.contains("id='fan-pub-7'"), "{iq}");
        assert!(
            iq.contains("<publish node='urn:xmpp:avatar:metadata'><item id='fan-1764000000123456-7'><x/></item></publish>"),
            "{iq}"
        );
        assert_eq!(
            publish_iq(0, 5, "p"),
            publish_item_iq(0, &item(0, 5).0, &item(0, 5).1, "p")
        );
        let n = parse(&format!(
            "<message xmlns='jabber:client' from='user2@localhost' to='user1@localhost/bench'>\
             <event xmlns='{NS_EVENT}'><items node='urn:xmpp:avatar:metadata'><item id='{id}'>\
             <metadata xmlns='urn:xmpp:avatar:metadata'/></item></items></event></message>"
        ));
        assert_eq!(notified_item_id(&n), Some(id.as_str()));
        let retract = parse(&format!(
            "<message xmlns='jabber:client' from='user2@localhost'><event xmlns='{NS_EVENT}'>\
             <items node='n'><retract id='{id}'/></items></event></message>"
        ));
        assert_eq!(notified_item_id(&retract), None);
    }

    #[test]
    fn items_are_realistic_and_published_with_their_options() {
        for (k, node) in NODES.iter().enumerate() {
            let iq = parse(&publish_iq(k, 17, "pub0"));
            let ps = iq.get_child("pubsub", NS_PUBSUB).unwrap();
            let publish = ps.get_child("publish", NS_PUBSUB).unwrap();
            assert_eq!(publish.attr("node"), Some(node.node));
            let item = publish.get_child("item", NS_PUBSUB).unwrap();
            assert!(item.attr("id").is_some());
            let size = item.to_string().len();
            assert!((60..700).contains(&size), "node {k}: {size} bytes");
            let options = ps.get_child("publish-options", NS_PUBSUB);
            assert_eq!(options.is_some(), node.open, "node {k}");
        }
        let (id, payload) = item(0, 17);
        assert_eq!(id.len(), 40, "XEP-0084: the id is the SHA-1 of the image");
        assert!(payload.contains(&id));
        assert_eq!(item(2, 17), item(2, 17), "deterministic");
        assert_ne!(item(2, 17), item(2, 18));
        let open = parse(&publish_iq(2, 1, "p"));
        let form = open
            .get_child("pubsub", NS_PUBSUB)
            .and_then(|p| p.get_child("publish-options", NS_PUBSUB))
            .and_then(|o| o.get_child("x", "jabber:x:data"))
            .unwrap();
        let access = form
            .children()
            .find(|f| f.attr("var") == Some("pubsub#access_model"))
            .and_then(|f| f.get_child("value", "jabber:x:data"))
            .map(|v| v.text());
        assert_eq!(access.as_deref(), Some("open"));
    }

    #[test]
    fn notifications_and_iqs_are_told_apart() {
        let caps = Caps::new(&NODES[..1]);
        let n = parse(&format!(
            "<message xmlns='jabber:client' type='headline' from='User2@localhost' to='user1@localhost/bench'>\
             <event xmlns='{NS_EVENT}'><items node='urn:xmpp:avatar:metadata'><item id='x'/></items></event></message>"
        ));
        assert_eq!(
            notification(&n),
            Some(("user2@localhost".into(), "urn:xmpp:avatar:metadata".into()))
        );
        let err = parse(&format!(
            "<message xmlns='jabber:client' type='error' from='user2@localhost'><event xmlns='{NS_EVENT}'/></message>"
        ));
        assert_eq!(notification(&err), None);
        let chat = parse(
            "<message xmlns='jabber:client' from='user2@localhost'><body>hi</body></message>",
        );
        assert_eq!(notification(&chat), None);
        let push = parse(&format!(
            "<iq xmlns='jabber:client' type='set' id='push1'><query xmlns='{NS_ROSTER}'>\
             <item jid='user2@localhost' subscription='both'/></query></iq>"
        ));
        assert_eq!(
            answer_iq(&push, &caps),
            Some(("<iq type='result' id='push1'/>".into(), false))
        );
        let ping = parse(
            "<iq xmlns='jabber:client' type='get' id='p1' from='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
        );
        assert_eq!(
            answer_iq(&ping, &caps),
            Some(("<iq type='result' id='p1' to='localhost'/>".into(), false))
        );
        let result = parse("<iq xmlns='jabber:client' type='result' id='pub0'/>");
        assert_eq!(answer_iq(&result, &caps), None);
    }
}
