//! What several modules share, in one place (no module imports another
//! module: what two modules need is here or behind a core trait):
//!
//! - [`archive_query`]: XEP-0313 query parsing and the storage-backed
//!   answer, for users' archives (mam) and rooms' (muc);
//! - [`write_behind`]: the batched, bounded write queues of the archive,
//!   the inbox and rooms' archives;
//! - [`pubsub`]: node configuration, publish requests and events, shared
//!   by PEP and the PubSub service;
//! - [`avatar`]: the PEP avatar as a vCard photo (vcard and PEP);
//! - [`copies`]: one stanza to many recipients, serialised once (rooms,
//!   MUC Light, PEP, PubSub);
//! - [`check_subdomain`]: the `subdomain` setting of a service module.

pub mod admin_api;
pub mod archive_query;
pub mod avatar;
pub mod pubsub;
pub mod write_behind;

use starling_core::module::ConfigProblem;

/// One message to many: the copies differ only in `to`, so the stanza is
/// serialised once and every copy's connection writes the shared bytes
/// with its own `to` spliced in (`Stanza::prepare`).
pub fn copies<I>(
    el: starling_xml::Element,
    from: starling_proto::Jid,
    to: I,
) -> Vec<starling_proto::Stanza>
where
    I: IntoIterator<Item = starling_proto::Jid>,
    I::IntoIter: ExactSizeIterator,
{
    let to = to.into_iter();
    let mut template = starling_proto::Stanza::new(el, Some(from), None);
    if to.len() > 1 {
        template.prepare();
    }
    to.map(|to| {
        let mut copy = template.clone();
        copy.set_to(Some(to));
        copy
    })
    .collect()
}

/// Checks a service's `subdomain` setting: one DNS label of lowercase
/// letters, digits and '-' (RFC 1035 §2.3.4: at most 63 bytes), e.g.
/// `example` for `example.<each served domain>`.
pub fn check_subdomain(label: &str, example: &str) -> Result<(), ConfigProblem> {
    let ok = !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigProblem::new(
            "subdomain",
            format!(
                "must be one DNS label of lowercase letters, digits and '-', e.g. \"{example}\""
            ),
        ))
    }
}
