//! What the server tells about itself: its entity capabilities in the
//! stream features (XEP-0115 §6.3, asked by XEP-0479 Core) with a `ver`
//! that is the hash of its disco#info (§5.1), answered at `node#ver`
//! (§6.2); its contact addresses (XEP-0157) as an extended-information
//! form (XEP-0128); nothing advertised that is not enabled.

use base64::Engine;
use sha1::Digest;
use starling_testkit::stanza::{empty, iq_get};
use starling_testkit::starling_xml::Element;
use starling_testkit::{ns, TestServer};

const CAPS: &str = "http://jabber.org/protocol/caps";

/// XEP-0115 §5.1 over a disco#info result (identities without xml:lang
/// here; forms sorted by FORM_TYPE, fields by var, values sorted).
fn ver_of(q: &Element) -> String {
    let mut ids: Vec<String> = q
        .children()
        .filter(|c| c.name() == "identity")
        .map(|i| {
            format!(
                "{}/{}//{}",
                i.attr("category").unwrap_or(""),
                i.attr("type").unwrap_or(""),
                i.attr("name").unwrap_or("")
            )
        })
        .collect();
    ids.sort();
    let mut features: Vec<&str> = q
        .children()
        .filter(|c| c.name() == "feature")
        .filter_map(|f| f.attr("var"))
        .collect();
    features.sort_unstable();
    let mut s = String::new();
    for x in ids.iter().map(String::as_str).chain(features) {
        s.push_str(x);
        s.push('<');
    }
    for x in q.children().filter(|c| c.is("x", "jabber:x:data")) {
        let mut fields: Vec<(String, Vec<String>)> = x
            .children()
            .filter(|f| f.name() == "field")
            .map(|f| {
                let mut v: Vec<String> = f.children().map(|v| v.text()).collect();
                v.sort();
                (f.attr("var").unwrap_or("").to_owned(), v)
            })
            .collect();
        fields.sort();
        let form_type = fields
            .iter()
            .find(|(k, _)| k == "FORM_TYPE")
            .map(|(_, v)| v[0].clone())
            .unwrap();
        s.push_str(&form_type);
        s.push('<');
        for (k, vs) in fields.iter().filter(|(k, _)| k != "FORM_TYPE") {
            s.push_str(k);
            s.push('<');
            for v in vs {
                s.push_str(v);
                s.push('<');
            }
        }
    }
    base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(s.as_bytes()))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_announces_its_capabilities_and_contact_addresses() {
    let server = TestServer::start_with(|c| {
        let d = c.modules.get_mut::<starling_server::modules::Disco>();
        d.contact
            .insert("abuse".into(), vec!["mailto:abuse@localhost".into()]);
        d.contact.insert(
            "support".into(),
            vec![
                "xmpp:support@localhost".into(),
                "https://localhost/help".into(),
            ],
        );
    })
    .await;
    let mut alice = server.login("alice").await;
    let features = alice.features.clone().expect("post-auth features");
    let c = features
        .get_child("c", CAPS)
        .unwrap_or_else(|| panic!("no caps in {features}"));
    assert_eq!(c.attr("hash"), Some("sha-1"));
    let (node, ver) = (
        c.attr("node").unwrap().to_owned(),
        c.attr("ver").unwrap().to_owned(),
    );
    // §6.2: the node#ver query answers what the hash was made of.
    let r = alice
        .iq(
            &iq_get(
                "localhost",
                "caps",
                &format!("<query xmlns='{}' node='{node}#{ver}'/>", ns::DISCO_INFO),
            ),
            "caps",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let q = r.get_child("query", ns::DISCO_INFO).unwrap();
    assert_eq!(q.attr("node"), Some(format!("{node}#{ver}").as_str()));
    assert_eq!(ver_of(q), ver, "the ver is the hash of {q}");
    // XEP-0157 / XEP-0128: the contact addresses in the plain disco#info.
    let r = alice
        .iq(
            &iq_get("localhost", "di", &empty("query", ns::DISCO_INFO)),
            "di",
        )
        .await;
    let q = r.get_child("query", ns::DISCO_INFO).unwrap();
    let form = q
        .get_child("x", "jabber:x:data")
        .unwrap_or_else(|| panic!("no serverinfo form in {q}"));
    let text = form.to_string();
    assert!(
        text.contains("http://jabber.org/network/serverinfo"),
        "{text}"
    );
    assert!(
        text.contains("abuse-addresses") && text.contains("mailto:abuse@localhost"),
        "{text}"
    );
    assert!(
        text.contains("support-addresses") && text.contains("https://localhost/help"),
        "{text}"
    );
    assert_eq!(ver_of(q), ver);
    // Another node is not known.
    let e = alice
        .iq(
            &iq_get(
                "localhost",
                "n",
                &format!("<query xmlns='{}' node='{node}#bogus'/>", ns::DISCO_INFO),
            ),
            "n",
        )
        .await;
    assert_eq!(
        starling_testkit::error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    server.stop().await;
}

/// A configuration with an unknown contact kind or a non-URI is refused
/// at start with what to write instead.
#[test]
fn bad_contact_addresses_are_refused_by_check_config() {
    let dir = std::env::temp_dir().join(format!("starling-contact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("starling.toml");
    for (toml, want) in [
        (
            "[modules.disco.contact]\nabuse = [\"not a uri\"]\n",
            "is not a URI",
        ),
        (
            "[modules.disco.contact]\nmarketing = [\"mailto:x@y\"]\n",
            "not an XEP-0157 address kind",
        ),
    ] {
        std::fs::write(
            &cfg,
            format!(
                "[server]\ndata_dir = \"{}\"\n{toml}",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_starling"))
            .arg("--config")
            .arg(&cfg)
            .arg("check-config")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml}: {err}");
        assert!(err.contains(want), "{toml}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// XEP-0215: STUN and TURN servers from the configuration, with
/// per-user, time-limited TURN credentials (coturn's shared secret).
#[tokio::test(flavor = "multi_thread")]
async fn external_services_list_stun_and_turn_with_credentials() {
    use hmac::{Hmac, KeyInit, Mac};
    const NS: &str = "urn:xmpp:extdisco:2";
    let server = TestServer::start_with(|c| {
        let x = c.modules.get_mut::<starling_server::modules::Extdisco>();
        let svc = |kind: &str, host: &str, port: u16| {
            starling_server::modules::extdisco::ExternalService {
                kind: kind.into(),
                host: host.into(),
                port,
                transport: "udp".into(),
                name: None,
                secret: None,
                username: None,
                password: None,
                ttl_secs: 600,
            }
        };
        x.services.push(svc("stun", "stun.localhost", 3478));
        let mut turn = svc("turn", "turn.localhost", 3478);
        turn.secret = Some("s3cret".into());
        x.services.push(turn);
        let mut fixed = svc("turns", "relay.localhost", 5349);
        fixed.transport = "tcp".into();
        fixed.username = Some("guest".into());
        fixed.password = Some("guestpw".into());
        x.services.push(fixed);
    })
    .await;
    let mut alice = server.login("alice").await;
    let f = alice.disco_features("localhost").await;
    assert!(f.iter().any(|x| x == NS), "{f:?}");
    let r = alice
        .iq(&iq_get("localhost", "s", &empty("services", NS)), "s")
        .await;
    let list: Vec<Element> = r
        .get_child("services", NS)
        .unwrap()
        .children()
        .cloned()
        .collect();
    assert_eq!(list.len(), 3, "{r}");
    let turn = list
        .iter()
        .find(|s| s.attr("type") == Some("turn"))
        .unwrap();
    let user = turn.attr("username").unwrap();
    let (expiry, who) = user.split_once(':').unwrap();
    assert_eq!(who, "alice@localhost");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expiry: u64 = expiry.parse().unwrap();
    assert!(
        (now + 590..=now + 610).contains(&expiry),
        "{expiry} vs {now}"
    );
    let mut mac = <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(b"s3cret").unwrap();
    mac.update(user.as_bytes());
    let want = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    assert_eq!(turn.attr("password"), Some(want.as_str()), "{turn}");
    assert_eq!(turn.attr("restricted"), Some("1"));
    assert!(turn.attr("expires").is_some_and(|e| e.ends_with('Z')));
    let stun = list
        .iter()
        .find(|s| s.attr("type") == Some("stun"))
        .unwrap();
    assert!(
        stun.attr("username").is_none() && stun.attr("password").is_none(),
        "{stun}"
    );
    assert!(
        !r.to_string().contains("s3cret"),
        "the secret stays on the server"
    );
    // §3.2: one type only.
    let r = alice
        .iq(
            &iq_get(
                "localhost",
                "t",
                &format!("<services xmlns='{NS}' type='turns'/>"),
            ),
            "t",
        )
        .await;
    let only: Vec<&Element> = r.get_child("services", NS).unwrap().children().collect();
    assert_eq!(only.len(), 1, "{r}");
    assert_eq!(
        (only[0].attr("username"), only[0].attr("password")),
        (Some("guest"), Some("guestpw"))
    );
    // §3.3: credentials for one service; an unknown one is item-not-found.
    let r = alice
        .iq(
            &iq_get(
                "localhost",
                "c",
                &format!("<credentials xmlns='{NS}'><service host='turn.localhost' type='turn'/></credentials>"),
            ),
            "c",
        )
        .await;
    let svc = r
        .get_child("credentials", NS)
        .and_then(|c| c.get_child("service", NS))
        .unwrap_or_else(|| panic!("{r}"));
    assert!(svc.attr("password").is_some(), "{r}");
    let e = alice
        .iq(
            &iq_get(
                "localhost",
                "u",
                &format!("<credentials xmlns='{NS}'><service host='nope.localhost' type='turn'/></credentials>"),
            ),
            "u",
        )
        .await;
    assert_eq!(
        starling_testkit::error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    server.stop().await;
}

/// Without configured services the module does not run and nothing is
/// advertised.
#[tokio::test(flavor = "multi_thread")]
async fn no_external_services_nothing_advertised() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let f = alice.disco_features("localhost").await;
    assert!(!f.iter().any(|x| x == "urn:xmpp:extdisco:2"), "{f:?}");
    let e = alice
        .iq(
            "<iq type='get' id='s' to='localhost'><services xmlns='urn:xmpp:extdisco:2'/></iq>",
            "s",
        )
        .await;
    assert_eq!(
        starling_testkit::error_condition(&e).as_deref(),
        Some("service-unavailable"),
        "{e}"
    );
    server.stop().await;
}
