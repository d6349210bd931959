//! Fills a Starling SQLite database with a large message archive and
//! measures archive page queries directly on the storage layer.
//!
//! ```text
//! cargo run --release -p starling-storage --example archive_fill -- \
//!     --db /tmp/big/data/starling.db --owner user0@localhost --rows 10000000 \
//!     [--contacts 50] [--contact-pattern 'contact{n}@localhost'] [--contact-first 0]
//!     [--days 365] [--measure 2000] [--url postgres://…/db instead of --db]
//! ```
//!
//! Rows are spread evenly over the last `--days` days (ids are
//! time-ordered), alternate direction, and talk to `--contacts` partners
//! named by `--contact-pattern` (`{n}` runs from `--contact-first`). For
//! `starling-bench archive --users 1 --partners 2` use `--owner
//! user1@localhost --contacts 2 --contact-pattern 'user{n}@localhost'
//! --contact-first 2`, so its `with` queries name real partners. Then `--measure` queries of each kind run and
//! their latency percentiles are printed: the latest page (50), a page
//! after a random id deep in the archive, the latest page with one contact,
//! and a page before a random id with one contact. Point a Starling at the
//! same database to measure end to end with `starling-bench archive`.

use starling_core::storage::{ArchiveId, ArchiveQuery, ArchiveRecord, WithFilter, FLAG_BODY};
use starling_proto::BareJid;
use starling_storage::{open, BackendConfig};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

struct Args {
    db: std::path::PathBuf,
    url: Option<String>,
    owner: String,
    rows: u64,
    contacts: u64,
    contact_pattern: String,
    contact_first: u64,
    days: u64,
    measure: usize,
}

fn parse() -> Args {
    let mut a = Args {
        db: "archive.db".into(),
        url: None,
        owner: "user0@localhost".into(),
        rows: 1_000_000,
        contacts: 50,
        contact_pattern: "contact{n}@localhost".into(),
        contact_first: 0,
        days: 365,
        measure: 2000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--db" => a.db = v.into(),
            "--url" => a.url = Some(v),
            "--owner" => a.owner = v,
            "--rows" => a.rows = v.parse().expect("--rows N"),
            "--contacts" => a.contacts = v.parse().expect("--contacts N"),
            "--contact-pattern" => a.contact_pattern = v,
            "--contact-first" => a.contact_first = v.parse().expect("--contact-first N"),
            "--days" => a.days = v.parse().expect("--days N"),
            "--measure" => a.measure = v.parse().expect("--measure N"),
            _ => panic!("unknown argument {k}; see the file's documentation"),
        }
    }
    a
}

/// A small deterministic generator (xorshift64*), enough for picking ids.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let a = parse();
    let owner = BareJid::new(&a.owner).expect("--owner must be a bare JID");
    let backend = match &a.url {
        Some(url) => BackendConfig::Postgres {
            url: url.clone(),
            pool_size: 4,
        },
        None => BackendConfig::Sqlite {
            path: a.db.clone(),
            pool_size: 4,
        },
    };
    let storage = open(&backend).await.expect("open the database");
    let store = storage.archive.clone();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let span = a.days as i64 * 86_400 * 1_000_000;
    let step = (span / a.rows.max(1) as i64).max(1);
    let start = now - span;
    let existing = store
        .count(&owner, &ArchiveQuery::default())
        .await
        .expect("count");
    if existing >= a.rows {
        eprintln!("{owner} already has {existing} messages; not filling");
    } else {
        let t0 = Instant::now();
        let batch = 5000u64;
        let mut i = existing;
        while i < a.rows {
            let n = batch.min(a.rows - i);
            let recs: Vec<ArchiveRecord> = (i..i + n)
                .map(|k| {
                    let contact = a
                        .contact_pattern
                        .replace("{n}", &(a.contact_first + k % a.contacts).to_string());
                    let outgoing = k % 2 == 0;
                    let (from, to) = if outgoing {
                        (format!("{owner}/phone"), contact.clone())
                    } else {
                        (format!("{contact}/laptop"), owner.to_string())
                    };
                    ArchiveRecord {
                        owner: owner.clone(),
                        id: ArchiveId::from_parts(start + k as i64 * step, 0),
                        with_bare: contact.clone(),
                        remote: if outgoing { contact.clone() } else { from.clone() },
                        outgoing,
                        origin_id: Some(format!("m{k}")),
                        flags: FLAG_BODY,
                        stanza: format!(
                            "<message xmlns='jabber:client' from='{from}' to='{to}' type='chat' id='m{k}'><body>Message number {k} of the benchmark archive, about as long as a chat line.</body><markable xmlns='urn:xmpp:chat-markers:0'/></message>"
                        ),
                    }
                })
                .collect();
            store.append(&recs).await.expect("append");
            i += n;
            if i % 500_000 < batch || i == a.rows {
                let el = t0.elapsed().as_secs_f64();
                eprintln!(
                    "filled {i}/{} ({:.0} rows/s, {:.0} s)",
                    a.rows,
                    (i - existing) as f64 / el,
                    el
                );
            }
        }
    }
    if a.measure == 0 {
        return;
    }
    let (first, last) = store
        .bounds(&owner)
        .await
        .unwrap()
        .expect("archive not empty");
    let total = store.count(&owner, &ArchiveQuery::default()).await.unwrap();
    println!("archive of {owner}: {total} messages");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let random_id = |rng: &mut Rng| {
        let span = (last.0 - first.0) as u64;
        // Any id inside the range; the page starts at the next real message.
        ArchiveId(first.0 + (rng.next() % span) as i64)
    };
    let kinds: [(&str, u8); 4] = [
        ("latest page (max 50, RSM <before/>)", 0),
        ("page after a random id (max 50)", 1),
        ("latest page with one contact", 2),
        ("page before a random id, one contact", 3),
    ];
    for (label, kind) in kinds {
        let mut lat = Vec::with_capacity(a.measure);
        for _ in 0..a.measure {
            let contact = a.contact_pattern.replace(
                "{n}",
                &(a.contact_first + rng.next() % a.contacts).to_string(),
            );
            let q = match kind {
                0 => ArchiveQuery {
                    limit: 50,
                    from_end: true,
                    ..Default::default()
                },
                1 => ArchiveQuery {
                    limit: 50,
                    after: Some(random_id(&mut rng)),
                    ..Default::default()
                },
                2 => ArchiveQuery {
                    limit: 50,
                    from_end: true,
                    with: Some(WithFilter::Bare(contact)),
                    ..Default::default()
                },
                _ => ArchiveQuery {
                    limit: 50,
                    from_end: true,
                    before: Some(random_id(&mut rng)),
                    with: Some(WithFilter::Bare(contact)),
                    ..Default::default()
                },
            };
            let t = Instant::now();
            let page = store.query(&owner, &q).await.unwrap();
            lat.push(t.elapsed());
            assert!(
                !page.messages.is_empty() || kind == 1,
                "{label}: empty page"
            );
        }
        println!(
            "{label:<40} p50 {:>6.2} ms  p90 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.9),
            pct(&mut lat, 0.99),
            pct(&mut lat, 1.0)
        );
    }
    storage.backend.close().await;
}
