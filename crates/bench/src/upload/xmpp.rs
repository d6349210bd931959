//! The XMPP side of the `upload` scenario: slot requests and answers
//! (XEP-0363), the service's discovery.

use crate::client::{Conn, Event};
use crate::{client, engine};
use starling_xml::Element;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// XEP-0363's namespace.
pub const NS_UPLOAD: &str = "urn:xmpp:http:upload:0";
const NS_DISCO_ITEMS: &str = "http://jabber.org/protocol/disco#items";
const NS_DISCO_INFO: &str = "http://jabber.org/protocol/disco#info";
const NS_DATA: &str = "jabber:x:data";
const NS_STANZAS: &str = "urn:ietf:params:xml:ns:xmpp-stanzas";

/// A granted slot (XEP-0363 §4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Where to PUT.
    pub put: String,
    /// Headers to send with the PUT (only those §4 allows:
    /// Authorization, Cookie, Expires; line breaks removed).
    pub headers: Vec<(String, String)>,
    /// Where to GET.
    pub get: String,
}

/// A slot request iq.
pub fn slot_request(id: &str, service: &str, filename: &str, size: u64, ctype: &str) -> String {
    let e = client::xml_escape;
    format!(
        "<iq type='get' id='{}' to='{}'><request xmlns='{NS_UPLOAD}' filename='{}' size='{size}' content-type='{}'/></iq>",
        e(id),
        e(service),
        e(filename),
        e(ctype)
    )
}

/// The condition of an error iq (`file-too-large` when the service says
/// so, §6).
fn error_condition(iq: &Element) -> String {
    let err = iq.children().find(|c| c.name() == "error");
    if err.is_some_and(|e| e.has_child("file-too-large", NS_UPLOAD)) {
        return "file-too-large".into();
    }
    err.and_then(|e| e.children().find(|c| c.ns() == NS_STANZAS))
        .map(|c| c.name().to_owned())
        .unwrap_or_else(|| "undefined-condition".into())
}

/// Parses the answer to a slot request: the slot, or a cause (the error
/// condition, `malformed`) and a detail.
pub fn parse_slot(iq: &Element) -> Result<Slot, (String, String)> {
    if iq.attr("type") == Some("error") {
        let cond = error_condition(iq);
        let text = iq
            .children()
            .find(|c| c.name() == "error")
            .and_then(|e| e.children().find(|c| c.name() == "text"))
            .map(|t| format!(": {}", t.text()))
            .unwrap_or_default();
        return Err((cond.clone(), format!("slot refused: {cond}{text}")));
    }
    let malformed = |d: &str| ("malformed".to_owned(), d.to_owned());
    if iq.attr("type") != Some("result") {
        return Err(malformed("the answer is not a result iq"));
    }
    let slot = iq
        .get_child("slot", NS_UPLOAD)
        .ok_or_else(|| malformed("result without <slot xmlns='urn:xmpp:http:upload:0'/>"))?;
    let url = |name: &str| {
        slot.get_child(name, NS_UPLOAD)
            .and_then(|e| e.attr("url"))
            .filter(|u| !u.trim().is_empty())
            .map(|u| u.trim().to_owned())
            .ok_or_else(|| malformed(&format!("<slot/> without <{name} url/>")))
    };
    let (put, get) = (url("put")?, url("get")?);
    let headers = slot
        .get_child("put", NS_UPLOAD)
        .into_iter()
        .flat_map(|p| p.children())
        .filter(|h| h.name() == "header")
        .filter_map(|h| {
            let name = h.attr("name")?.trim();
            let allowed = ["Authorization", "Cookie", "Expires"];
            let name = allowed.iter().find(|a| a.eq_ignore_ascii_case(name))?;
            let value: String = h
                .text()
                .chars()
                .filter(|c| *c != '\r' && *c != '\n')
                .collect();
            Some(((*name).to_owned(), value.trim().to_owned()))
        })
        .collect();
    Ok(Slot { put, headers, get })
}

/// The JIDs of a disco#items result.
pub fn disco_items(iq: &Element) -> Vec<String> {
    iq.get_child("query", NS_DISCO_ITEMS)
        .into_iter()
        .flat_map(|q| q.children())
        .filter(|i| i.name() == "item" && i.attr("node").is_none())
        .filter_map(|i| i.attr("jid").map(str::to_owned))
        .collect()
}

/// What a disco#info result says about upload: `None` if it is not an
/// upload service (identity store/file and the feature), else its
/// `max-file-size` if announced.
pub fn upload_info(iq: &Element) -> Option<Option<u64>> {
    let q = iq.get_child("query", NS_DISCO_INFO)?;
    let identity = q.children().any(|c| {
        c.name() == "identity"
            && c.attr("category") == Some("store")
            && c.attr("type") == Some("file")
    });
    let feature = q
        .children()
        .any(|c| c.name() == "feature" && c.attr("var") == Some(NS_UPLOAD));
    if !identity || !feature {
        return None;
    }
    let field_value = |x: &Element, var: &str| {
        x.children()
            .find(|f| f.name() == "field" && f.attr("var") == Some(var))
            .and_then(|f| f.children().find(|v| v.name() == "value"))
            .map(|v| v.text().trim().to_owned())
    };
    let max = q
        .children()
        .filter(|x| x.is("x", NS_DATA))
        .find(|x| field_value(x, "FORM_TYPE").as_deref() == Some(NS_UPLOAD))
        .and_then(|x| field_value(x, "max-file-size"))
        .and_then(|v| v.parse().ok());
    Some(max)
}

/// The answer to one iq and how long it took, or a cause and a detail.
type IqAnswer = Result<(Element, Duration), (String, String)>;

/// One logged-in user.
pub(super) struct Session {
    pub(super) conn: Conn,
    pub(super) user: u64,
}

impl Session {
    async fn next(&mut self) -> Result<Element, String> {
        loop {
            match self.conn.next_event().await {
                Ok(Event::Element(el)) => return Ok(el),
                Ok(Event::Header) => continue,
                Ok(Event::Closed) => return Err("the server closed the stream".into()),
                Err(e) => return Err(format!("{e:#}")),
            }
        }
    }

    /// Sends the iqs at once and waits for their answers (result or error
    /// iq), answering the server's own iqs meanwhile. Per request: the
    /// answer and how long it took, or `timeout`/`closed`.
    pub(super) async fn iqs(
        &mut self,
        reqs: Vec<(String, String)>,
        timeout: Duration,
    ) -> Vec<IqAnswer> {
        if reqs.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<Option<IqAnswer>> = reqs.iter().map(|_| None).collect();
        let index: HashMap<String, usize> = reqs
            .iter()
            .enumerate()
            .map(|(i, (id, _))| (id.clone(), i))
            .collect();
        let xml: String = reqs.iter().map(|(_, x)| x.as_str()).collect();
        let t0 = Instant::now();
        let mut left = reqs.len();
        let fail_all = |out: &mut Vec<Option<_>>, cause: &str, detail: String| {
            for o in out.iter_mut().filter(|o| o.is_none()) {
                *o = Some(Err((cause.to_owned(), detail.clone())));
            }
        };
        if let Err(e) = self.conn.send(xml.as_bytes()).await {
            fail_all(&mut out, "closed", format!("cannot send: {e}"));
            left = 0;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        while left > 0 {
            let el = match tokio::time::timeout_at(deadline, self.next()).await {
                Err(_) => {
                    fail_all(&mut out, "timeout", format!("no answer in {timeout:?}"));
                    break;
                }
                Ok(Err(e)) => {
                    fail_all(&mut out, "closed", e);
                    break;
                }
                Ok(Ok(el)) => el,
            };
            if el.name() != "iq" {
                continue;
            }
            if let Some(reply) = engine::iq_reply(&el) {
                let _ = self.conn.send(reply.as_bytes()).await;
                continue;
            }
            if let Some(&i) = el.attr("id").and_then(|id| index.get(id)) {
                if out[i].is_none() {
                    out[i] = Some(Ok((el, t0.elapsed())));
                    left -= 1;
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(("closed".into(), "no answer".into()))))
            .collect()
    }

    pub(super) async fn close(mut self) {
        let _ =
            tokio::time::timeout(Duration::from_secs(2), self.conn.send(b"</stream:stream>")).await;
    }
}

/// The upload service and its limit.
#[derive(Debug)]
pub(super) struct Service {
    pub(super) jid: String,
    pub(super) discovered: bool,
    pub(super) max: Option<u64>,
}

pub(super) async fn discover(
    s: &mut Session,
    domain: &str,
    explicit: Option<&str>,
    t: Duration,
) -> anyhow::Result<Service> {
    let info_req = |id: &str, jid: &str| {
        (
            id.to_owned(),
            format!(
                "<iq type='get' id='{id}' to='{}'><query xmlns='{NS_DISCO_INFO}'/></iq>",
                client::xml_escape(jid)
            ),
        )
    };
    if let Some(jid) = explicit {
        let r = s.iqs(vec![info_req("up-info", jid)], t).await;
        let max = match r.into_iter().next() {
            Some(Ok((el, _))) => upload_info(&el).flatten(),
            _ => None,
        };
        return Ok(Service {
            jid: jid.to_owned(),
            discovered: false,
            max,
        });
    }
    let items = format!(
        "<iq type='get' id='up-items' to='{}'><query xmlns='{NS_DISCO_ITEMS}'/></iq>",
        client::xml_escape(domain)
    );
    let r = s.iqs(vec![("up-items".into(), items)], t).await;
    let items = match r.into_iter().next() {
        Some(Ok((el, _))) if el.attr("type") == Some("result") => disco_items(&el),
        Some(Ok((el, _))) => {
            anyhow::bail!("disco#items of {domain} failed: {}", error_condition(&el))
        }
        Some(Err((c, d))) => anyhow::bail!("disco#items of {domain}: {c}: {d}"),
        None => Vec::new(),
    };
    let reqs: Vec<(String, String)> = items
        .iter()
        .enumerate()
        .map(|(i, jid)| info_req(&format!("up-info-{i}"), jid))
        .collect();
    let answers = s.iqs(reqs, t).await;
    for (jid, a) in items.iter().zip(answers) {
        if let Ok((el, _)) = a {
            if let Some(max) = upload_info(&el) {
                return Ok(Service {
                    jid: jid.clone(),
                    discovered: true,
                    max,
                });
            }
        }
    }
    anyhow::bail!(
        "no HTTP File Upload service (identity store/file, feature {NS_UPLOAD}) among the {} \
         disco#items of {domain} ({}); enable one (Starling: [modules.upload] enabled = true \
         and an [[http.listen]]) or name it with --service",
        items.len(),
        items.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rooms::test_util::parse;
    #[test]
    fn slot_requests_are_escaped_xml() {
        let xml = slot_request("s1", "upload.example.org", "a'b&<c>.bin", 123, "image/png");
        let el = parse(&format!("<wrap xmlns='jabber:client'>{xml}</wrap>"));
        let iq = el.children().next().unwrap();
        assert_eq!(
            (iq.attr("type"), iq.attr("to")),
            (Some("get"), Some("upload.example.org"))
        );
        let r = iq.get_child("request", NS_UPLOAD).unwrap();
        assert_eq!(r.attr("filename"), Some("a'b&<c>.bin"));
        assert_eq!(r.attr("size"), Some("123"));
        assert_eq!(r.attr("content-type"), Some("image/png"));
    }

    #[test]
    fn slots_are_parsed() {
        // XEP-0363 §4, Example 5, with a header that must be dropped and
        // one with a line break.
        let iq = parse(
            "<iq xmlns='jabber:client' from='upload.montague.tld' id='step_03' to='romeo@montague.tld/garden' type='result'>\
             <slot xmlns='urn:xmpp:http:upload:0'>\
             <put url='https://upload.montague.tld/4a771ac1-f0b2-4a4a-9700-f2a26fa2bb67/tr%C3%A8s%20cool.jpg'>\
             <header name='Authorization'>Basic Base64String==</header>\
             <header name='Cookie'>foo=bar;\r\n user=romeo</header>\
             <header name='X-Evil'>no</header>\
             </put>\
             <get url=' https://download.montague.tld/4a771ac1-f0b2-4a4a-9700-f2a26fa2bb67/tr%C3%A8s%20cool.jpg'/>\
             </slot></iq>",
        );
        let s = parse_slot(&iq).unwrap();
        assert!(s.put.starts_with("https://upload.montague.tld/4a77"));
        assert!(
            s.get.starts_with("https://download.montague.tld/"),
            "trimmed"
        );
        assert_eq!(
            s.headers,
            vec![
                (
                    "Authorization".to_owned(),
                    "Basic Base64String==".to_owned()
                ),
                ("Cookie".to_owned(), "foo=bar; user=romeo".to_owned()),
            ]
        );
        // §6: too large, with the limit; quota; other errors.
        let too_large = parse(
            "<iq xmlns='jabber:client' id='s' type='error'><error type='modify'>\
             <not-acceptable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/>\
             <text xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'>File too large. The maximum file size is 20000 bytes</text>\
             <file-too-large xmlns='urn:xmpp:http:upload:0'><max-file-size>20000</max-file-size></file-too-large>\
             </error></iq>",
        );
        let (cause, detail) = parse_slot(&too_large).unwrap_err();
        assert_eq!(cause, "file-too-large");
        assert!(detail.contains("20000 bytes"), "{detail}");
        let quota = parse(
            "<iq xmlns='jabber:client' id='s' type='error'><error type='wait'>\
             <resource-constraint xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/>\
             <retry xmlns='urn:xmpp:http:upload:0' stamp='2017-12-03T23:42:05Z'/></error></iq>",
        );
        assert_eq!(parse_slot(&quota).unwrap_err().0, "resource-constraint");
        let bare = parse("<iq xmlns='jabber:client' id='s' type='error'/>");
        assert_eq!(parse_slot(&bare).unwrap_err().0, "undefined-condition");
        for bad in [
            "<iq xmlns='jabber:client' id='s' type='result'/>",
            "<iq xmlns='jabber:client' id='s' type='result'><slot xmlns='urn:xmpp:http:upload:0'><put url='http://a/b'/></slot></iq>",
            "<iq xmlns='jabber:client' id='s' type='result'><slot xmlns='urn:xmpp:http:upload:0'><put url=''/><get url='http://a/b'/></slot></iq>",
            "<iq xmlns='jabber:client' id='s' type='result'><slot xmlns='urn:xmpp:http:upload'><put url='http://a/b'/><get url='http://a/b'/></slot></iq>",
        ] {
            assert_eq!(parse_slot(&parse(bad)).unwrap_err().0, "malformed", "{bad}");
        }
    }

    #[test]
    fn the_upload_service_is_recognised() {
        let items = parse(
            "<iq xmlns='jabber:client' type='result' id='up-items'>\
             <query xmlns='http://jabber.org/protocol/disco#items'>\
             <item jid='conference.localhost'/><item jid='localhost' node='x'/>\
             <item jid='upload.localhost' name='HTTP File Upload'/></query></iq>",
        );
        assert_eq!(
            disco_items(&items),
            vec!["conference.localhost", "upload.localhost"]
        );
        // XEP-0363 §3, Example 2.
        let info = parse(
            "<iq xmlns='jabber:client' type='result' id='i'>\
             <query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='store' type='file' name='HTTP File Upload'/>\
             <feature var='urn:xmpp:http:upload:0'/>\
             <x type='result' xmlns='jabber:x:data'>\
             <field var='FORM_TYPE' type='hidden'><value>urn:xmpp:http:upload:0</value></field>\
             <field var='max-file-size'><value>5242880</value></field></x>\
             <x type='result' xmlns='jabber:x:data'>\
             <field var='FORM_TYPE' type='hidden'><value>urn:xmpp:other</value></field>\
             <field var='max-file-size'><value>1</value></field></x>\
             </query></iq>",
        );
        assert_eq!(upload_info(&info), Some(Some(5_242_880)));
        let no_limit = parse(
            "<iq xmlns='jabber:client' type='result' id='i'><query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='store' type='file'/><feature var='urn:xmpp:http:upload:0'/></query></iq>",
        );
        assert_eq!(upload_info(&no_limit), Some(None));
        let muc = parse(
            "<iq xmlns='jabber:client' type='result' id='i'><query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='conference' type='text'/><feature var='urn:xmpp:http:upload:0'/></query></iq>",
        );
        assert_eq!(upload_info(&muc), None, "identity store/file is required");
        let old = parse(
            "<iq xmlns='jabber:client' type='result' id='i'><query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='store' type='file'/><feature var='urn:xmpp:http:upload'/></query></iq>",
        );
        assert_eq!(
            upload_info(&old),
            None,
            "the pre-0.3 namespace is not this protocol"
        );
    }
}
