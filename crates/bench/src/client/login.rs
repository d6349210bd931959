//! Negotiation: stream opening, STARTTLS, SASL (PLAIN, SCRAM, SASL2),
//! resource binding, up to an established session ([`establish`]).

use super::resume::{enable_sm, sasl2_with_token, sync_after_bind};
use super::stream::{Conn, Event, Inbound};
use super::tls::{device, SALTED};
use super::transport::{Transport, WsIo};
use super::{
    fail, Carrier, Cause, Mech, SetupError, Target, TlsMode, Via, NS_BIND, NS_FRAMING, NS_SASL,
    NS_SASL2, NS_STREAMS, NS_TLS, USER_AGENT_ID,
};
use base64::Engine as _;
use rustls::pki_types::ServerName;
use starling_proto::sasl::ScramClient;
use starling_xml::Element;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpSocket, TcpStream};

pub(super) async fn step<T>(
    t: Duration,
    cause_on_err: Cause,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> Result<T, SetupError> {
    step_named(t, cause_on_err, "", f).await
}

async fn step_named<T>(
    t: Duration,
    cause_on_err: Cause,
    what: &str,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> Result<T, SetupError> {
    match tokio::time::timeout(t, f).await {
        Err(_) => fail(Cause::Timeout, format!("timed out {what}")),
        Ok(Err(e)) => fail(cause_on_err, format!("{e:#}")),
        Ok(Ok(v)) => Ok(v),
    }
}

/// Reads the next element, mapping a close to [`Cause::Closed`].
pub(super) async fn expect_element(
    conn: &mut Conn,
    t: Duration,
    what: &str,
) -> Result<Element, SetupError> {
    loop {
        let label = format!("waiting for {what}");
        match step_named(t, Cause::Stream, &label, conn.next_event()).await? {
            Event::Header => continue,
            // RFC 7395 framing: <open/> is the header.
            Event::Element(el) if el.ns() == NS_FRAMING && el.name() == "open" => continue,
            Event::Element(el) if el.ns() == NS_FRAMING => {
                return fail(Cause::Closed, format!("closed before {what}"))
            }
            Event::Element(el) if el.is("error", NS_STREAMS) => {
                let cond: Vec<_> = el.children().map(|c| c.name().to_owned()).collect();
                return fail(
                    Cause::Stream,
                    format!("stream error while waiting for {what}: {}", cond.join(",")),
                );
            }
            Event::Element(el) => return Ok(el),
            Event::Closed => return fail(Cause::Closed, format!("closed before {what}")),
        }
    }
}

async fn open_stream(conn: &mut Conn, target: &Target) -> Result<Element, SetupError> {
    if let Transport::Bosh(b) = &conn.io {
        // Session creation, or the restart after SASL (XEP-0206 §5).
        b.open();
        return features(conn, target).await;
    }
    let header = if target.carrier == Carrier::Websocket {
        format!(
            "<open xmlns='{NS_FRAMING}' to='{}' version='1.0' xml:lang='en'/>",
            target.domain
        )
    } else {
        format!(
            "<?xml version='1.0'?><stream:stream to='{}' version='1.0' xml:lang='en' \
         xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>",
            target.domain
        )
    };
    step(target.step_timeout, Cause::Closed, async {
        Ok(conn.send(header.as_bytes()).await?)
    })
    .await?;
    features(conn, target).await
}

pub(super) async fn features(conn: &mut Conn, target: &Target) -> Result<Element, SetupError> {
    let f = expect_element(conn, target.step_timeout, "stream features").await?;
    if !f.is("features", NS_STREAMS) {
        return fail(
            Cause::Stream,
            format!("expected features, got {}", f.name()),
        );
    }
    Ok(f)
}

async fn tcp_connect(target: &Target, source: Via) -> Result<TcpStream, SetupError> {
    let f = async {
        let sock = if source.addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(ip) = source.source {
            sock.bind(SocketAddr::new(ip, 0))?;
        }
        let s = sock.connect(source.addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    };
    step_named(target.step_timeout, Cause::Connect, "in TCP connect", f).await
}

async fn tls_upgrade(target: &Target, tcp: TcpStream) -> Result<Transport, SetupError> {
    let name = ServerName::try_from(target.domain.clone()).map_err(|e| SetupError {
        cause: Cause::Tls,
        detail: format!("bad server name: {e}"),
    })?;
    let f = async { Ok(target.tls_connector.connect(name, tcp).await?) };
    let tls = step_named(target.step_timeout, Cause::Tls, "in TLS handshake", f).await?;
    Ok(Transport::Tls(Box::new(tls)))
}

/// A TCP connection, with TLS from the first byte for `--tls direct`.
pub async fn connect_transport(target: &Target, source: Via) -> Result<Transport, SetupError> {
    let tcp = tcp_connect(target, source).await?;
    if target.tls == TlsMode::Direct {
        tls_upgrade(target, tcp).await
    } else {
        Ok(Transport::Plain(tcp))
    }
}

/// Connects and negotiates up to (but not including) SASL; returns the
/// connection and the features offered for authentication.
pub async fn connect_stream(target: &Target, source: Via) -> Result<(Conn, Element), SetupError> {
    if target.carrier == Carrier::Bosh {
        if target.tls == TlsMode::Starttls {
            return fail(
                Cause::Tls,
                "BOSH has no STARTTLS: use --tls plain (http:) or --tls direct (https:)",
            );
        }
        let io = crate::bosh::BoshIo::connect(target, source).await?;
        let mut conn = Conn {
            io: Transport::Bosh(Box::new(io)),
            inbound: Inbound::websocket(),
            sm_id: None,
        };
        let features = open_stream(&mut conn, target).await?;
        return Ok((conn, features));
    }
    let io = connect_transport(target, source).await?;
    if target.carrier == Carrier::Websocket {
        if target.tls == TlsMode::Starttls {
            return fail(
                Cause::Tls,
                "WebSocket has no STARTTLS: use --tls plain (ws:) or --tls direct (wss:)",
            );
        }
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let scheme = if target.tls == TlsMode::Direct {
            "wss"
        } else {
            "ws"
        };
        let mut req = format!("{scheme}://{}/xmpp-websocket", target.addr)
            .into_client_request()
            .map_err(|e| SetupError {
                cause: Cause::Connect,
                detail: format!("WebSocket request: {e}"),
            })?;
        req.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            "xmpp".parse().expect("header value"),
        );
        let f = async { Ok(tokio_tungstenite::client_async(req, io).await?.0) };
        let ws = step_named(
            target.step_timeout,
            Cause::Connect,
            "in WebSocket upgrade",
            f,
        )
        .await?;
        let mut conn = Conn {
            io: Transport::Ws(Box::new(WsIo::new(ws))),
            inbound: Inbound::websocket(),
            sm_id: None,
        };
        let features = open_stream(&mut conn, target).await?;
        return Ok((conn, features));
    }
    let mut conn = Conn {
        io,
        inbound: Inbound::default(),
        sm_id: None,
    };
    let mut features = open_stream(&mut conn, target).await?;
    if target.tls == TlsMode::Starttls {
        if !features.has_child("starttls", NS_TLS) {
            return fail(Cause::Stream, "server does not offer STARTTLS");
        }
        step(target.step_timeout, Cause::Closed, async {
            Ok(conn
                .send(b"<starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>")
                .await?)
        })
        .await?;
        let p = expect_element(&mut conn, target.step_timeout, "<proceed/>").await?;
        if !p.is("proceed", NS_TLS) {
            return fail(Cause::Tls, format!("STARTTLS refused: {}", p.name()));
        }
        let Transport::Plain(tcp) = conn.io else {
            return fail(Cause::Tls, "STARTTLS on TLS");
        };
        conn.io = tls_upgrade(target, tcp).await?;
        conn.restart();
        features = open_stream(&mut conn, target).await?;
    }
    Ok((conn, features))
}

pub(super) async fn send_step(conn: &mut Conn, t: Duration, s: String) -> Result<(), SetupError> {
    step(t, Cause::Closed, async {
        Ok(conn.send(s.as_bytes()).await?)
    })
    .await
}

pub(super) async fn authenticate(
    conn: &mut Conn,
    target: &Target,
    user: &str,
    password: &str,
    sasl2: Option<&str>,
) -> Result<Option<Element>, SetupError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let t = target.step_timeout;
    // XEP-0388: the same exchange in urn:xmpp:sasl:2, the initial response
    // in its own element, `inline` requests next to it, and the
    // server-final message as <additional-data/> of the <success/>.
    let ns = if sasl2.is_some() { NS_SASL2 } else { NS_SASL };
    let start = |mech: &str, data: &[u8]| {
        match sasl2 {
        Some(inline) => format!(
            "<authenticate xmlns='{NS_SASL2}' mechanism='{mech}'><initial-response>{}</initial-response><user-agent id='{}'/>{inline}</authenticate>",
            b64.encode(data),
            USER_AGENT_ID
        ),
        None => format!(
            "<auth xmlns='{NS_SASL}' mechanism='{mech}'>{}</auth>",
            b64.encode(data)
        ),
    }
    };
    let final_data = |el: &Element| -> Vec<u8> {
        let text = match sasl2 {
            Some(_) => el
                .get_child("additional-data", NS_SASL2)
                .map(|d| d.text())
                .unwrap_or_default(),
            None => el.text(),
        };
        b64.decode(text.trim()).unwrap_or_default()
    };
    let failure = |el: &Element| {
        let cond: Vec<_> = el.children().map(|c| c.name().to_owned()).collect();
        SetupError {
            cause: Cause::Auth,
            detail: format!("{} {}", el.name(), cond.join(",")),
        }
    };
    if target.mech == Mech::Plain {
        let msg = format!("\0{user}\0{password}");
        send_step(conn, t, start("PLAIN", msg.as_bytes())).await?;
        let reply = expect_element(conn, t, "SASL result").await?;
        if !reply.is("success", ns) {
            return Err(failure(&reply));
        }
        Ok(sasl2.map(|_| reply))
    } else {
        let mech = target.mech.mechanism();
        let dev = device();
        let kept = dev.and_then(|n| {
            SALTED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&n)
                .cloned()
        });
        let mut scram = ScramClient::new(mech, user, password, None)
            .map_err(|e| SetupError {
                cause: Cause::Auth,
                detail: format!("SCRAM client: {e}"),
            })?
            .with_salted_password(kept);
        let first = scram.client_first();
        send_step(conn, t, start(mech.name(), &first)).await?;
        let challenge = expect_element(conn, t, "SASL challenge").await?;
        if !challenge.is("challenge", ns) {
            return Err(failure(&challenge));
        }
        let server_first = b64
            .decode(challenge.text().trim())
            .map_err(|e| SetupError {
                cause: Cause::Auth,
                detail: format!("bad base64 in challenge: {e}"),
            })?;
        // PBKDF2 is CPU-heavy; keep it off the I/O threads' hot path.
        let (scram, fin) = tokio::task::spawn_blocking(move || {
            let fin = scram.client_final(&server_first);
            (scram, fin)
        })
        .await
        .map_err(|e| SetupError {
            cause: Cause::Auth,
            detail: format!("PBKDF2 task: {e}"),
        })?;
        let fin = fin.map_err(|e| SetupError {
            cause: Cause::Auth,
            detail: format!("SCRAM: {e}"),
        })?;
        send_step(
            conn,
            t,
            format!("<response xmlns='{ns}'>{}</response>", b64.encode(fin)),
        )
        .await?;
        let mut reply = expect_element(conn, t, "SASL result").await?;
        if sasl2.is_none() && reply.is("challenge", NS_SASL) {
            // Some servers send the server-final message as a challenge.
            let data = b64.decode(reply.text().trim()).unwrap_or_default();
            if scram.verify_server_final(&data).is_err() {
                return fail(Cause::Auth, "server signature does not verify");
            }
            send_step(conn, t, format!("<response xmlns='{NS_SASL}'/>")).await?;
            reply = expect_element(conn, t, "SASL result").await?;
            if !reply.is("success", NS_SASL) {
                return Err(failure(&reply));
            }
        } else if reply.is("success", ns) {
            let data = final_data(&reply);
            if scram.verify_server_final(&data).is_err() {
                return fail(Cause::Auth, "server signature does not verify");
            }
        } else {
            return Err(failure(&reply));
        }
        if let (Some(n), Some(salted)) = (dev, scram.salted_password()) {
            SALTED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(n, salted.clone());
        }
        Ok(sasl2.map(|_| reply))
    }
}

/// Connects, authenticates as `user` and restarts the stream (RFC 6120
/// §6.4.6); returns the connection with the post-authentication features.
pub(super) async fn authenticated_stream(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
) -> Result<(Conn, Element), SetupError> {
    let (mut conn, features) = connect_stream(target, source).await?;
    if !features.has_child("mechanisms", NS_SASL) {
        return fail(Cause::Stream, "server offers no SASL mechanisms");
    }
    authenticate(&mut conn, target, user, password, None).await?;
    conn.restart();
    let features = open_stream(&mut conn, target).await?;
    Ok((conn, features))
}

/// Logs in as `user` and binds `resource`; sends `<presence/>` if asked.
/// Returns the established connection.
pub async fn establish(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
    resource: &str,
    presence: bool,
) -> Result<Conn, SetupError> {
    let (mut conn, features) = if target.fast {
        sasl2_with_token(target, source, user, password).await?
    } else {
        authenticated_stream(target, source, user, password).await?
    };
    if !features.has_child("bind", NS_BIND) {
        return fail(Cause::Bind, "server offers no resource binding");
    }
    let t = target.step_timeout;
    let bind = format!(
        "<iq type='set' id='b1'><bind xmlns='{NS_BIND}'><resource>{resource}</resource></bind></iq>"
    );
    step(t, Cause::Closed, async {
        Ok(conn.send(bind.as_bytes()).await?)
    })
    .await?;
    loop {
        let reply = expect_element(&mut conn, t, "bind result").await?;
        if reply.name() != "iq" || reply.attr("id") != Some("b1") {
            continue;
        }
        if reply.attr("type") != Some("result") {
            return fail(Cause::Bind, format!("bind refused: {reply}"));
        }
        break;
    }
    // Legacy session establishment (RFC 3921) when the server insists.
    if let Some(s) = features.get_child("session", "urn:ietf:params:xml:ns:xmpp-session") {
        if !s.has_child("optional", "urn:ietf:params:xml:ns:xmpp-session") {
            let iq = "<iq type='set' id='s1'><session xmlns='urn:ietf:params:xml:ns:xmpp-session'/></iq>";
            step(t, Cause::Closed, async {
                Ok(conn.send(iq.as_bytes()).await?)
            })
            .await?;
            loop {
                let reply = expect_element(&mut conn, t, "session result").await?;
                if reply.name() == "iq" && reply.attr("id") == Some("s1") {
                    break;
                }
            }
        }
    }
    if target.sm {
        enable_sm(&mut conn, t).await?;
    }
    if target.full_login {
        sync_after_bind(&mut conn, t).await?;
    }
    if presence {
        step(t, Cause::Closed, async {
            Ok(conn.send(b"<presence/>").await?)
        })
        .await?;
    }
    if let Transport::Bosh(b) = &conn.io {
        b.start_polling();
    }
    Ok(conn)
}
