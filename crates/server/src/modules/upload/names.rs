//! What the upload service accepts as names: file names (sanitised for
//! the URL and `Content-Disposition`), slot ids and media types.

use super::*;

/// The file name of a slot request, normalised to a safe name, or why it
/// is refused: empty, longer than 255 bytes, with `/`, control characters
/// or a `..` component. Backslashes, characters Windows refuses and
/// bidirectional controls (which disguise extensions) become `_`, as does
/// a leading dot (no hidden files); surrounding spaces go.
pub(crate) fn safe_filename(raw: &str) -> Result<String, &'static str> {
    let name = raw.trim();
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_FILENAME_BYTES {
        return Err("it is longer than 255 bytes");
    }
    if name.contains('/') {
        return Err("it contains '/'");
    }
    if name.chars().any(char::is_control) {
        return Err("it contains control characters");
    }
    if name.split('\\').any(|part| part == "." || part == "..") {
        return Err("it is or contains a '..' or '.' path component");
    }
    let mut out: String = name
        .chars()
        .map(|c| match c {
            '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|' => '_',
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => '_',
            c => c,
        })
        .collect();
    if out.starts_with('.') {
        out.replace_range(..1, "_");
    }
    Ok(out)
}

/// RFC 3986 percent-encoding of everything but unreserved characters
/// (XEP-0363 §4: non-ASCII characters MUST be percent-encoded); also a
/// valid RFC 8187 `filename*` value.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b)
}

/// A media type (`type/subtype`, optional parameters) as announced in a
/// slot request; only printable ASCII, so it is a valid header value.
#[derive(Debug)]
pub(crate) struct MediaType {
    /// `type/subtype`, lowercase.
    pub(crate) essence: String,
    /// As given (trimmed), served as `Content-Type`.
    pub(crate) full: String,
    /// Whatever follows the first `;`.
    pub(super) params: String,
}

impl MediaType {
    pub(crate) fn parse(s: &str) -> Option<MediaType> {
        let s = s.trim();
        if s.is_empty() || s.len() > 255 || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return None;
        }
        let (essence, params) = match s.split_once(';') {
            Some((e, p)) => (e.trim(), p.trim()),
            None => (s, ""),
        };
        let (ty, sub) = essence.split_once('/')?;
        let token = |t: &str| !t.is_empty() && t.bytes().all(is_token_byte);
        (token(ty) && token(sub)).then(|| MediaType {
            essence: essence.to_ascii_lowercase(),
            full: s.to_owned(),
            params: params.to_owned(),
        })
    }
}

pub(crate) fn valid_slot_id(s: &str) -> bool {
    s.len() == SLOT_ID_LEN && s.bytes().all(|b| SLOT_ID_ALPHABET.contains(&b))
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ---------------------------------------------------------------------
// Files on disk.
