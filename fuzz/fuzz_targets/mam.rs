//! Fuzz the XEP-0313 archive query parser (crates/server/src/modules/common/archive_query.rs `parse`,
//! shared by users' and rooms' archives): the `<query/>` with its data form (`with`,
//! `start`, `end`, `before-id`, `after-id`, `ids`) and XEP-0059 RSM `<set/>` (`max`,
//! `after`, `before`, `index`). The input is an XML element; default and maximum page sizes
//! come from the first byte. Beyond "no panic": the page size never exceeds the maximum,
//! the `ids` are at most one page, and the ids to check (each must exist) are sorted, unique
//! and include every id of `ids`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_server::fuzzing;
use starling_xml::Element;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(q) = text.parse::<Element>() else {
        return;
    };
    let max_page = u32::from(first % 16) + 1;
    let default_page = max_page.min(u32::from(first >> 4) + 1);
    let Ok(r) = fuzzing::mam_query(&q, default_page, max_page) else {
        return;
    };
    assert!(r.limit <= max_page, "{r:?}");
    assert!(r.ids.len() <= max_page as usize, "{r:?}");
    assert!(r.ids_to_check.windows(2).all(|w| w[0] < w[1]), "{r:?}");
    for id in &r.ids {
        assert!(r.ids_to_check.binary_search(id).is_ok(), "{r:?}");
    }
});
