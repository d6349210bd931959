//! The documentation's default configuration is real: it parses, and it
//! equals the built-in defaults.

use starling_server::Config;
use std::path::Path;

#[test]
fn configuration_doc_block_parses_and_matches_defaults() {
    let doc = include_str!("../../../../docs/configuration.md");
    let start = doc.find("```toml\n").expect("toml block") + "```toml\n".len();
    let end = start + doc[start..].find("```").expect("end of block");
    let cfg = Config::parse(&doc[start..end], Path::new("docs/configuration.md")).unwrap();
    // Debug output covers every field: the documented values are the defaults.
    assert_eq!(format!("{cfg:?}"), format!("{:?}", Config::default()));
}
