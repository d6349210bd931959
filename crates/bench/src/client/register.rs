//! In-band registration (XEP-0077).

use super::login::{connect_stream, expect_element, step};
use super::{fail, Cause, SetupError, Target, Via, NS_REGISTER};

/// Outcome of one in-band registration.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// The account was created.
    Created,
    /// It already existed (`<conflict/>`).
    Exists,
}

/// Escapes text for XML character data and single-quoted attributes.
pub(crate) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
}

/// Registers `user` with XEP-0077 in-band registration.
pub async fn register(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
) -> Result<Registered, SetupError> {
    let (mut conn, _features) = connect_stream(target, source).await?;
    let iq = format!(
        "<iq type='set' id='r1'><query xmlns='{NS_REGISTER}'><username>{}</username><password>{}</password></query></iq>",
        xml_escape(user),
        xml_escape(password)
    );
    let t = target.step_timeout;
    step(t, Cause::Closed, async {
        Ok(conn.send(iq.as_bytes()).await?)
    })
    .await?;
    let result = loop {
        let reply = expect_element(&mut conn, t, "registration result").await?;
        if reply.name() != "iq" || reply.attr("id") != Some("r1") {
            continue;
        }
        if reply.attr("type") == Some("result") {
            break Ok(Registered::Created);
        }
        let err = reply
            .children()
            .find(|c| c.name() == "error")
            .map(|e| {
                e.children()
                    .map(|c| c.name().to_owned())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if err.iter().any(|c| c == "conflict") {
            break Ok(Registered::Exists);
        }
        break fail(
            Cause::Auth,
            format!("registration refused: {}", err.join(",")),
        );
    };
    let _ = conn.send(b"</stream:stream>").await;
    result
}
