//! Message Archive Management (XEP-0313) for scenario tests: a query to
//! an archive (the own account's, §3.1, or a room's, §3.3.2) with its
//! filtering form (§4.1) and Result Set Management page (§4.2, XEP-0059),
//! and the page that comes back: the forwarded messages with their
//! archive ids, then the final iq with its `<fin/>` (§4.3). Section
//! numbers are XEP-0313's (version 1.1.3).
//!
//! ```no_run
//! # use starling_testkit::{mam, TestServer};
//! # async fn scenario() {
//! let server = TestServer::start().await;
//! let mut alice = server.login("alice").await;
//! let page = mam::ok_query(&mut alice, "", "q1", &mam::max(10, "")).await;
//! assert!(page.complete());
//! assert!(page.bodies().is_empty());
//! # }
//! ```

use crate::{error_condition, ns, Client};
use starling_xml::Element;

/// XEP-0313's namespace.
pub const MAM: &str = "urn:xmpp:mam:2";
/// Result Set Management (XEP-0059), the paging of a query.
pub const RSM: &str = "http://jabber.org/protocol/rsm";
/// Stanza Forwarding (XEP-0297), the wrapper of each result.
pub const FORWARD: &str = "urn:xmpp:forward:0";
/// Delayed Delivery (XEP-0203), the stamp of each result.
pub const DELAY: &str = "urn:xmpp:delay";

/// What one query brought: the forwarded messages (with their result ids,
/// §4.2) and the final iq (a result with `<fin/>`, §4.3, or an error).
pub struct Page {
    /// (archive id, forwarded message) of each result, in order.
    pub items: Vec<(String, Element)>,
    /// The answer to the query.
    pub fin: Element,
}

impl Page {
    /// The bodies of the forwarded messages (empty without a body).
    pub fn bodies(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|(_, m)| {
                m.get_child("body", ns::CLIENT)
                    .map(|b| b.text())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The archive ids of the results.
    pub fn ids(&self) -> Vec<String> {
        self.items.iter().map(|(id, _)| id.clone()).collect()
    }

    /// `<fin complete='true'/>` (§4.3): the last page.
    pub fn complete(&self) -> bool {
        self.fin
            .get_child("fin", MAM)
            .and_then(|f| f.attr("complete"))
            == Some("true")
    }

    /// The text of RSM element `name` (`first`, `last`, `count`) in
    /// `<fin/>`.
    pub fn rsm(&self, name: &str) -> Option<String> {
        self.fin
            .get_child("fin", MAM)?
            .get_child("set", RSM)?
            .get_child(name, RSM)
            .map(|e| e.text())
    }

    /// The defined condition if the query was refused, `None` if answered.
    pub fn error(&self) -> Option<String> {
        (self.fin.attr("type") == Some("error"))
            .then(|| error_condition(&self.fin).unwrap_or_default())
    }
}

/// A submitted filtering form (§4.1) with `fields` (`with`, `start`,
/// `end`, `ids`, `after-id`, …).
pub fn form(fields: &[(&str, &str)]) -> String {
    let mut x = format!(
        "<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE' type='hidden'><value>{MAM}</value></field>"
    );
    for (var, value) in fields {
        x.push_str(&format!(
            "<field var='{var}'><value>{value}</value></field>"
        ));
    }
    x.push_str("</x>");
    x
}

/// An RSM `<set/>` (§4.2, XEP-0059 §2) with `inner`.
pub fn rsm(inner: &str) -> String {
    format!("<set xmlns='{RSM}'>{inner}</set>")
}

/// An RSM `<set/>` asking for at most `n` results, with `extra`
/// (`<after>…</after>`, `<before/>`).
pub fn max(n: u32, extra: &str) -> String {
    rsm(&format!("<max>{n}</max>{extra}"))
}

/// §4: sends a query with `inner` (form, RSM, `<flip-page/>`) to the
/// archive `to` (empty: the own account's, §3.1; a room's bare JID,
/// §3.3.2) and collects the results up to the answer, which may be an
/// error. Each result must carry the query id, come from the archive and
/// forward a message with a delay stamp (§4.2); a successful answer to a
/// room comes from the room.
pub async fn query(c: &mut Client, to: &str, qid: &str, inner: &str) -> Page {
    let id = format!("mam-{qid}");
    let archive = if to.is_empty() {
        c.jid.split('/').next().unwrap_or_default().to_owned()
    } else {
        to.to_owned()
    };
    let to_attr = if to.is_empty() {
        String::new()
    } else {
        format!(" to='{to}'")
    };
    c.send(&format!(
        "<iq type='set' id='{id}'{to_attr}><query xmlns='{MAM}' queryid='{qid}'>{inner}</query></iq>"
    ))
    .await;
    let mut items = Vec::new();
    loop {
        let el = c.recv().await;
        if el.name() == "iq" && el.attr("id") == Some(id.as_str()) {
            if !to.is_empty() && el.attr("type") == Some("result") {
                assert_eq!(el.attr("from"), Some(to), "{el}");
            }
            return Page { items, fin: el };
        }
        if let Some(r) = el.get_child("result", MAM) {
            assert_eq!(r.attr("queryid"), Some(qid), "{el}");
            assert_eq!(
                el.attr("from"),
                Some(archive.as_str()),
                "results come from the archive: {el}"
            );
            let fwd = r
                .get_child("forwarded", FORWARD)
                .unwrap_or_else(|| panic!("no forwarded message: {el}"));
            assert!(
                fwd.get_child("delay", DELAY)
                    .and_then(|d| d.attr("stamp"))
                    .is_some(),
                "§4.2: a delay stamp: {el}"
            );
            let m = fwd
                .get_child("message", ns::CLIENT)
                .unwrap_or_else(|| panic!("no forwarded message: {el}"))
                .clone();
            items.push((r.attr("id").unwrap().to_owned(), m));
        }
    }
}

/// [`query`], asserting that it was answered with a result.
pub async fn ok_query(c: &mut Client, to: &str, qid: &str, inner: &str) -> Page {
    let p = query(c, to, qid, inner).await;
    assert_eq!(p.fin.attr("type"), Some("result"), "{}", p.fin);
    p
}

/// [`query`], asserting that it was refused without results; the defined
/// condition.
pub async fn err_query(c: &mut Client, to: &str, qid: &str, inner: &str) -> String {
    let p = query(c, to, qid, inner).await;
    assert_eq!(p.fin.attr("type"), Some("error"), "{}", p.fin);
    assert!(p.items.is_empty());
    error_condition(&p.fin).unwrap()
}
