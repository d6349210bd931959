//! Stream management (XEP-0198) and resumption, FAST tokens (XEP-0484).

use super::login::{
    authenticate, authenticated_stream, connect_stream, expect_element, send_step, step,
};
use super::stream::Conn;
use super::tls::{device, NS_FAST, TOKENS};
use super::transport::Transport;
use super::{fail, Cause, SetupError, Target, Via, NS_SASL2, NS_STREAMS, USER_AGENT_ID};
use base64::Engine as _;
use starling_xml::Element;
use std::time::Duration;

/// XEP-0198's namespace.
pub const NS_SM: &str = "urn:xmpp:sm:3";

/// What Conversations, Dino and Gajim ask for at every fresh session (one
/// that was not resumed) before the initial presence: the roster (RFC 6121
/// §2.2), message carbons (XEP-0280), the block list (XEP-0191) and the
/// server's features (XEP-0030). A resumption restores all of it, which is
/// what `resume --full-login` compares. Sent in one batch (real clients
/// pipeline them too); every answer must be a result.
pub(super) async fn sync_after_bind(conn: &mut Conn, t: Duration) -> Result<(), SetupError> {
    const REQUESTS: &str = "<iq type='get' id='fl1'><query xmlns='jabber:iq:roster'/></iq>\
        <iq type='set' id='fl2'><enable xmlns='urn:xmpp:carbons:2'/></iq>\
        <iq type='get' id='fl3'><blocklist xmlns='urn:xmpp:blocking'/></iq>\
        <iq type='get' id='fl4'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>";
    step(t, Cause::Closed, async {
        Ok(conn.send(REQUESTS.as_bytes()).await?)
    })
    .await?;
    let mut pending = 4;
    while pending > 0 {
        let reply =
            expect_element(conn, t, "roster, carbons, block list and disco results").await?;
        let Some(id) = reply.attr("id").filter(|i| i.starts_with("fl")) else {
            continue;
        };
        if reply.name() != "iq" || reply.attr("type") != Some("result") {
            return fail(
                Cause::Bind,
                format!("full login: request {id} refused: {reply}"),
            );
        }
        pending -= 1;
    }
    Ok(())
}

/// Enables stream management with resumption (XEP-0198 §3, §5) and keeps
/// the resumption id.
pub(super) async fn enable_sm(conn: &mut Conn, t: Duration) -> Result<(), SetupError> {
    send_step(conn, t, format!("<enable xmlns='{NS_SM}' resume='true'/>")).await?;
    loop {
        let el = expect_element(conn, t, "<enabled/>").await?;
        if el.is("enabled", NS_SM) {
            conn.sm_id = el.attr("id").map(str::to_owned);
            if conn.sm_id.is_none() {
                return fail(Cause::Bind, "stream management enabled without resumption");
            }
            return Ok(());
        }
        if el.is("failed", NS_SM) {
            return fail(Cause::Bind, format!("stream management refused: {el}"));
        }
    }
}

/// Resumes a detached XEP-0198 session (§5): a new connection, SASL, then
/// `<resume previd h/>` instead of binding. Returns the connection and
/// the server's `h` from `<resumed/>`. Stanzas the server re-sends follow
/// on the connection.
pub async fn resume(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
    previd: &str,
    h: u32,
) -> Result<(Conn, u32), SetupError> {
    if target.sasl2 {
        return resume_inline(target, source, user, password, previd, h).await;
    }
    let (mut conn, features) = authenticated_stream(target, source, user, password).await?;
    if !features.has_child("sm", NS_SM) {
        return fail(Cause::Bind, "server offers no stream management");
    }
    let t = target.step_timeout;
    send_step(
        &mut conn,
        t,
        format!("<resume xmlns='{NS_SM}' previd='{previd}' h='{h}'/>"),
    )
    .await?;
    loop {
        let el = expect_element(&mut conn, t, "<resumed/>").await?;
        if el.is("resumed", NS_SM) {
            let server_h = el.attr("h").and_then(|h| h.parse().ok()).unwrap_or(0);
            conn.sm_id = Some(previd.to_owned());
            if let Transport::Bosh(b) = &conn.io {
                b.start_polling();
            }
            return Ok((conn, server_h));
        }
        if el.is("failed", NS_SM) {
            return fail(Cause::Bind, format!("resumption refused: {el}"));
        }
    }
}

/// SASL2 with SCRAM asking for a FAST token (kept for this device);
/// returns the connection and the features after the `<success/>`.
pub(super) async fn sasl2_with_token(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
) -> Result<(Conn, Element), SetupError> {
    let (mut conn, features) = connect_stream(target, source).await?;
    let offered = features
        .get_child("authentication", NS_SASL2)
        .and_then(|a| a.get_child("inline", NS_SASL2))
        .and_then(|i| i.get_child("fast", NS_FAST))
        .is_some_and(|f| f.children().any(|m| m.text() == "HT-SHA-256-NONE"));
    if !offered {
        return fail(Cause::Stream, "server offers no FAST with HT-SHA-256-NONE");
    }
    let inline = format!("<request-token xmlns='{NS_FAST}' mechanism='HT-SHA-256-NONE'/>");
    let success = authenticate(&mut conn, target, user, password, Some(&inline))
        .await?
        .expect("SASL2 returns its <success/>");
    let Some(token) = success
        .get_child("token", NS_FAST)
        .and_then(|t| t.attr("token"))
    else {
        return fail(Cause::Auth, format!("no FAST token in {success}"));
    };
    if let Some(n) = device() {
        TOKENS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n, token.to_owned());
    }
    let f = expect_element(&mut conn, target.step_timeout, "features after SASL2").await?;
    Ok((conn, f))
}

/// [`resume`] inline in SASL2 (XEP-0388, XEP-0198 "Inline Stream
/// Resumption"): `<resume/>` inside `<authenticate/>`, `<resumed/>` inside
/// `<success/>`, no stream restart and no separate round trip.
async fn resume_inline(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
    previd: &str,
    h: u32,
) -> Result<(Conn, u32), SetupError> {
    let (mut conn, features) = connect_stream(target, source).await?;
    let offered = features
        .get_child("authentication", NS_SASL2)
        .and_then(|a| a.get_child("inline", NS_SASL2))
        .is_some_and(|i| i.has_child("sm", NS_SM));
    if !offered {
        return fail(Cause::Stream, "server offers no inline resumption in SASL2");
    }
    let inline = format!("<resume xmlns='{NS_SM}' previd='{previd}' h='{h}'/>");
    let success = if target.fast {
        fast_authenticate(&mut conn, target, user, &inline).await?
    } else {
        authenticate(&mut conn, target, user, password, Some(&inline))
            .await?
            .expect("SASL2 returns its <success/>")
    };
    let Some(resumed) = success.get_child("resumed", NS_SM) else {
        return fail(Cause::Bind, format!("resumption refused: {success}"));
    };
    let server_h = resumed.attr("h").and_then(|h| h.parse().ok()).unwrap_or(0);
    // The features of the resumed stream follow (XEP-0388 "Success").
    let t = target.step_timeout;
    let f = expect_element(&mut conn, t, "features after SASL2").await?;
    if !f.is("features", NS_STREAMS) {
        return fail(Cause::Stream, format!("expected features, got {f}"));
    }
    conn.sm_id = Some(previd.to_owned());
    Ok((conn, server_h))
}

/// XEP-0484: one-step SASL2 authentication with this device's FAST token
/// (HT-SHA-256-NONE) and `inline` requests; keeps a rotated token.
async fn fast_authenticate(
    conn: &mut Conn,
    target: &Target,
    user: &str,
    inline: &str,
) -> Result<Element, SetupError> {
    use starling_proto::sasl::ht;
    let b64 = base64::engine::general_purpose::STANDARD;
    let t = target.step_timeout;
    let n = device();
    let Some(token) = n.and_then(|n| {
        TOKENS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&n)
            .cloned()
    }) else {
        return fail(
            Cause::Auth,
            "no FAST token for this user (its login did not get one)",
        );
    };
    let first = ht::initiator(user, token.as_bytes(), b"");
    send_step(
        conn,
        t,
        format!(
            "<authenticate xmlns='{NS_SASL2}' mechanism='HT-SHA-256-NONE'><initial-response>{}</initial-response><user-agent id='{USER_AGENT_ID}'/><fast xmlns='{NS_FAST}'/>{inline}</authenticate>",
            b64.encode(first)
        ),
    )
    .await?;
    let reply = expect_element(conn, t, "SASL2 result").await?;
    if !reply.is("success", NS_SASL2) {
        return fail(Cause::Auth, format!("FAST refused: {reply}"));
    }
    let data = reply
        .get_child("additional-data", NS_SASL2)
        .and_then(|d| b64.decode(d.text().trim()).ok())
        .unwrap_or_default();
    if data != ht::responder(token.as_bytes(), b"") {
        return fail(
            Cause::Auth,
            "the server's FAST responder message does not verify",
        );
    }
    if let (Some(n), Some(new)) = (
        n,
        reply
            .get_child("token", NS_FAST)
            .and_then(|t| t.attr("token")),
    ) {
        TOKENS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n, new.to_owned());
    }
    Ok(reply)
}
