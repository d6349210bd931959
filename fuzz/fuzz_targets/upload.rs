//! Fuzz what the HTTP upload service (XEP-0363, crates/server/src/modules/upload.rs) reads
//! from a request: `Range`, `If-Range`, `If-None-Match`, `If-Modified-Since`, the slot id and
//! file name of the URL path, and the file name and content type of a slot request.
//!
//! Input: 16 bytes of file length and upload time (little-endian), then the fields
//! separated by 0xFF in the order above (a missing field is an absent header). Beyond "no
//! panic": a served range lies inside the file; the file's own entity tag always satisfies
//! `If-Range` and `If-None-Match`; an accepted file name is safe on disk (no `/`, control
//! characters, `..` or leading dot, at most 255 bytes) and its URL encoding decodes back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_server::fuzzing;

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).expect("ASCII");
            out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
            i += 3;
        } else {
            assert!(b[i].is_ascii_alphanumeric() || b"-._~".contains(&b[i]));
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let (head, rest) = data.split_at(16);
    let length = u64::from_le_bytes(head[..8].try_into().unwrap()) >> (head[0] % 64);
    let uploaded = u64::from_le_bytes(head[8..].try_into().unwrap()) >> (head[8] % 64);
    let mut fields = rest.split(|b| *b == 0xFF);
    let mut next = || fields.next();
    let (range, if_range, if_none_match, since) = (next(), next(), next(), next());

    let r = fuzzing::upload_request(range, if_range, if_none_match, since, length, uploaded);
    match r.range {
        None => {}
        Some(None) => {}
        Some(Some((first, last))) => {
            assert!(first <= last && last < length, "{first}-{last} of {length}");
        }
    }
    if if_range.is_none() {
        assert!(r.if_range);
    }
    let etag = format!("\"{uploaded:x}-{length:x}\"");
    let own = fuzzing::upload_request(
        range,
        Some(etag.as_bytes()),
        Some(etag.as_bytes()),
        since,
        length,
        uploaded,
    );
    assert!(own.if_range && own.not_modified);

    let text = |f: Option<&[u8]>| String::from_utf8_lossy(f.unwrap_or_default()).into_owned();
    let (slot, filename, content_type) = (text(next()), text(next()), text(next()));
    let names = fuzzing::upload_names(&slot, &filename, &content_type);
    if names.slot_ok {
        assert_eq!(slot.len(), 32);
        assert!(slot.bytes().all(|b| b.is_ascii_alphanumeric()));
    }
    if let Ok(name) = &names.filename {
        assert!(!name.is_empty() && name.len() <= 255, "{name:?}");
        assert!(
            !name.contains(['/', '\\']) && !name.starts_with('.'),
            "{name:?}"
        );
        assert!(!name.chars().any(char::is_control), "{name:?}");
        assert!(name != "." && name != "..");
        let url = names
            .url_name
            .as_deref()
            .expect("an accepted name has a URL form");
        assert_eq!(percent_decode(url), name.as_bytes());
    }
    if let Some(essence) = &names.media_essence {
        assert_eq!(essence, &essence.to_ascii_lowercase());
        assert!(essence.contains('/'));
        let full = names.media_full.as_deref().unwrap();
        assert!(full.bytes().all(|b| (0x20..0x7f).contains(&b)));
    }
});
