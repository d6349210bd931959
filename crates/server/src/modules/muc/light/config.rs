//! MUC Light room configuration: fields checked against the service's
//! schema, and a member's change of them ("Setting room configuration").

use super::messages::notification;
use super::{
    bad, internal, new_version, not_allowed, Done, Inner, LAff, LightRoom, MucLightConfig,
    NS_CONFIGURATION,
};
use crate::modules::muc::host::error;
use starling_proto::{BareJid, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::collections::BTreeSet;

/// Parses configuration fields against the schema.
pub(super) fn parse_config(
    cfg: &MucLightConfig,
    parent: &Element,
    ns: &str,
) -> Result<Vec<(String, String)>, StanzaError> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for c in parent.children() {
        if c.ns() != ns {
            return Err(bad("configuration fields are in the query's namespace"));
        }
        let name = c.name();
        if name == "version" || name == "prev-version" {
            continue;
        }
        if !cfg.config_schema.contains_key(name) {
            return Err(bad(&format!(
                "unknown configuration field {name}; this service has: {}",
                cfg.config_schema
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let v = c.text();
        if v.chars().count() > cfg.max_value_len as usize {
            return Err(error(
                StanzaErrorCondition::NotAcceptable,
                &format!("{name} is longer than {} characters", cfg.max_value_len),
            ));
        }
        if !seen.insert(name.to_owned()) {
            return Err(bad("each field may appear once"));
        }
        out.push((name.to_owned(), v));
    }
    Ok(out)
}

/// "Setting room configuration": a delta; every member is told.
pub(super) async fn configure(
    host: &Inner,
    r: &mut LightRoom,
    sender: &BareJid,
    st: &Stanza,
    q: &Element,
) -> Result<Done, StanzaError> {
    if !host.cfg.all_can_configure && r.members.get(sender) != Some(&LAff::Owner) {
        return Err(not_allowed("only the owner may change the configuration"));
    }
    let fields = parse_config(&host.cfg, q, NS_CONFIGURATION)?;
    if fields.is_empty() {
        return Err(bad("name at least one configuration field"));
    }
    let prev = std::mem::replace(&mut r.version, new_version());
    for (k, v) in &fields {
        r.config.insert(k.clone(), v.clone());
    }
    if let Err(e) = host.store.put_room(&r.to_stored()).await {
        r.version = prev;
        return Err(internal(e, "storing the configuration"));
    }
    let mut x = Element::new("x", NS_CONFIGURATION);
    x.append_child(
        Element::builder("prev-version", NS_CONFIGURATION)
            .text(prev.as_str())
            .build(),
    );
    x.append_child(
        Element::builder("version", NS_CONFIGURATION)
            .text(r.version.as_str())
            .build(),
    );
    for (k, v) in &fields {
        x.append_child(
            Element::builder(k.as_str(), NS_CONFIGURATION)
                .text(v.as_str())
                .build(),
        );
    }
    let id = st.id().unwrap_or_default();
    let mut out: Vec<Stanza> = r
        .members
        .keys()
        .map(|m| notification(&r.jid, m, id, vec![x.clone()]))
        .collect();
    out.push(st.iq_result(None));
    Ok(Done::Kept(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_follows_the_schema() {
        let cfg = MucLightConfig::default();
        let q = |xml: &str| xml.parse::<Element>().unwrap();
        let ok = q("<query xmlns='urn:xmpp:muclight:0#configuration'><roomname>A</roomname><version>v</version></query>");
        assert_eq!(
            parse_config(&cfg, &ok, NS_CONFIGURATION).unwrap(),
            vec![("roomname".to_owned(), "A".to_owned())]
        );
        let unknown =
            q("<query xmlns='urn:xmpp:muclight:0#configuration'><colour>red</colour></query>");
        assert_eq!(
            parse_config(&cfg, &unknown, NS_CONFIGURATION)
                .unwrap_err()
                .condition,
            StanzaErrorCondition::BadRequest
        );
        let long = format!(
            "<query xmlns='urn:xmpp:muclight:0#configuration'><subject>{}</subject></query>",
            "x".repeat(1025)
        );
        assert_eq!(
            parse_config(&cfg, &q(&long), NS_CONFIGURATION)
                .unwrap_err()
                .condition,
            StanzaErrorCondition::NotAcceptable
        );
    }
}
