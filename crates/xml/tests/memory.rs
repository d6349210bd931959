//! Idle memory footprint of the parser. The server keeps one `StreamParser` per connection
//! (15k+ idle connections per node), so both the inline size and the heap retained between
//! stanzas matter. This is a separate test binary with a single test so that RSS
//! measurements are not disturbed by concurrently running tests.

mod common;

use common::*;
use starling_xml::{Element, Limits, Node, StreamParser};

fn rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn memory_idle_parser_small() {
    let inline = std::mem::size_of::<StreamParser>();
    println!("size_of::<StreamParser>() = {inline} bytes");
    println!(
        "size_of::<Element>() = {}, size_of::<Node>() = {}",
        std::mem::size_of::<Element>(),
        std::mem::size_of::<Node>()
    );
    println!(
        "size_of::<rxml::Parser>() = {}",
        std::mem::size_of::<rxml::Parser>()
    );
    assert!(inline <= 256, "StreamParser is {inline} bytes inline");

    // Drive many parsers through a header, a stanza with long text (forcing rxml to
    // allocate its token scratch buffers) and a keepalive, then measure what they retain.
    const N: usize = 20_000;
    let stanza = format!(
        "<message to='a@b' id='1'><body>{}</body></message> ",
        "x".repeat(4000)
    );
    let warm = {
        let mut p = StreamParser::new(Limits::default());
        feed(&mut p, HEADER.as_bytes()).unwrap();
        feed(&mut p, stanza.as_bytes()).unwrap();
        p
    };
    drop(warm);
    let Some(before) = rss_bytes() else {
        println!("no /proc/self/status; skipping heap measurement");
        return;
    };
    let mut parsers = Vec::with_capacity(N);
    for _ in 0..N {
        let mut p = StreamParser::new(Limits::default());
        feed(&mut p, HEADER.as_bytes()).unwrap();
        let evs = feed(&mut p, stanza.as_bytes()).unwrap();
        assert_eq!(evs.len(), 1);
        assert!(p.is_idle());
        parsers.push(p);
    }
    let after = rss_bytes().unwrap();
    let per = after.saturating_sub(before) / N;
    let heap = per.saturating_sub(inline);
    println!("idle parser: ~{per} bytes total per connection (RSS), ~{heap} bytes heap");
    assert!(per <= 4096, "idle parser retains ~{per} bytes");

    // Hibernated: only the stored header and our own struct remain.
    let before = rss_bytes().unwrap();
    let mut sleeping = Vec::with_capacity(N);
    for _ in 0..N {
        let mut p = StreamParser::new(Limits::default());
        feed(&mut p, HEADER.as_bytes()).unwrap();
        feed(&mut p, stanza.as_bytes()).unwrap();
        assert!(p.hibernate());
        sleeping.push(p);
    }
    let after = rss_bytes().unwrap();
    let hibernated = after.saturating_sub(before) / N;
    println!("hibernated parser: ~{hibernated} bytes total per connection (RSS)");
    assert!(
        hibernated * 2 < per,
        "hibernation should at least halve idle memory ({hibernated} vs {per})"
    );
    drop(parsers);
    drop(sleeping);
}
