//! Measures logging in with a large roster (issue 3's performance note):
//! an account with N contacts (subscription both, all online) connects,
//! negotiates STARTTLS + SCRAM-SHA-256, binds, fetches its roster and sends
//! initial presence; the clock stops when the presence of every contact has
//! arrived. Runs an in-process server on loopback.
//!
//! ```sh
//! cargo run --release -p starling-testkit --example roster_login -- 500 20
//! ```
//! (arguments: contacts, logins to time)

use starling_core::storage::{RosterItem, Subscription};
use starling_proto::sasl::Mechanism;
use starling_proto::BareJid;
use starling_server::modules;
use starling_testkit::{Client, TestServer};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let contacts: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let server = TestServer::start_with(|c| {
        c.c2s.max_bytes_per_second = 0;
        c.modules.get_mut::<modules::Roster>().max_items = (contacts as u32).max(1000);
    })
    .await;
    let storage = server.server.env.storage.clone();
    let owner = BareJid::new("owner@localhost").unwrap();
    server.create_user("owner", "pw-owner").await;
    eprintln!("seeding {contacts} contacts…");
    for i in 0..contacts {
        let name = format!("c{i}");
        let jid = BareJid::new(&format!("{name}@localhost")).unwrap();
        server.create_user(&name, &format!("pw-{name}")).await;
        let mut item = RosterItem::new(jid.clone());
        item.subscription = Subscription::Both;
        item.groups = vec!["Load".into()];
        storage.roster.put_item(&owner, &item).await.unwrap();
        let mut back = RosterItem::new(owner.clone());
        back.subscription = Subscription::Both;
        storage.roster.put_item(&jid, &back).await.unwrap();
    }
    eprintln!("bringing {contacts} contacts online…");
    // Kept alive (and unread) for the whole measurement.
    let mut online = Vec::with_capacity(contacts);
    for i in 0..contacts {
        online.push(server.login(&format!("c{i}")).await);
    }
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let start = Instant::now();
        let mut c = Client::connect(server.starttls_addr()).await;
        c.negotiate_tls().await;
        c.auth(Mechanism::ScramSha256, "owner", "pw-owner")
            .await
            .unwrap();
        c.bind(None).await;
        let roster = c
            .iq(
                "<iq type='get' id='r'><query xmlns='jabber:iq:roster'/></iq>",
                "r",
            )
            .await;
        let items = roster
            .get_child("query", "jabber:iq:roster")
            .map(|q| q.children().count())
            .unwrap_or(0);
        assert_eq!(items, contacts, "roster size");
        let roster_done = start.elapsed();
        c.send("<presence/>").await;
        let mut seen = std::collections::HashSet::new();
        while seen.len() < contacts {
            let el = c.recv().await;
            if el.name() == "presence" {
                if let Some(from) = el.attr("from") {
                    if !from.starts_with("owner@") && el.attr("type").is_none() {
                        seen.insert(from.to_owned());
                    }
                }
            }
        }
        let total = start.elapsed();
        eprintln!(
            "round {round}: roster fetched in {:.1} ms, all {contacts} presences in {:.1} ms",
            roster_done.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e3
        );
        times.push(total);
        c.close().await;
        // Let the owner's unavailable broadcast settle (the contacts' socket
        // buffers absorb it; nobody reads them).
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    times.sort();
    let pct = |p: f64| times[((times.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "login with a {contacts}-contact roster (STARTTLS + SCRAM-SHA-256 + bind + roster + all contact presences), {rounds} logins: p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.9).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3
    );
    drop(online);
    server.stop().await;
}
