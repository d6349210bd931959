//! Rosters (RFC 6121, XEP-0237 versions).

use super::jid;
use starling_core::storage::{RosterChange, RosterItem, Storage, Subscription};

/// Rosters: items, versions (XEP-0237), tombstones, pending requests.
pub async fn roster(s: &Storage) {
    let r = s.roster.as_ref();
    let alice = jid("alice@example.org");
    assert_eq!(r.get_roster(&alice).await.unwrap(), (0, vec![]));
    let mut bob = RosterItem::new(jid("bob@example.org"));
    bob.name = Some("Bob 'the builder'".into());
    bob.groups = vec!["Friends".into(), "Work & Play".into()];
    bob.ask = true;
    let v1 = r.put_item(&alice, &bob).await.unwrap();
    let mut carol = RosterItem::new(jid("carol@example.org"));
    carol.subscription = Subscription::Both;
    let v2 = r.put_item(&alice, &carol).await.unwrap();
    assert!(v2 > v1);
    let (v, items) = r.get_roster(&alice).await.unwrap();
    assert_eq!(v, v2);
    assert_eq!(
        items,
        vec![bob.clone(), carol.clone()],
        "sorted by JID, all fields kept"
    );
    assert_eq!(
        r.get_item(&alice, &bob.jid).await.unwrap(),
        Some(bob.clone())
    );
    assert_eq!(r.count(&alice).await.unwrap(), 2);

    // Update and removal are versioned; removal leaves a tombstone.
    bob.subscription = Subscription::To;
    bob.ask = false;
    bob.groups.clear();
    let v3 = r.put_item(&alice, &bob).await.unwrap();
    let v4 = r
        .remove_item(&alice, &carol.jid)
        .await
        .unwrap()
        .expect("was present");
    assert!(v4 > v3);
    assert_eq!(r.remove_item(&alice, &carol.jid).await.unwrap(), None);
    assert_eq!(r.get_item(&alice, &carol.jid).await.unwrap(), None);
    assert_eq!(r.count(&alice).await.unwrap(), 1);
    let (cur, changes) = r.changes_since(&alice, v2).await.unwrap().unwrap();
    assert_eq!(cur, v4);
    assert_eq!(
        changes,
        vec![
            RosterChange::Updated(bob.clone()),
            RosterChange::Removed(carol.jid.clone())
        ]
    );
    assert_eq!(
        r.changes_since(&alice, v4).await.unwrap(),
        Some((v4, vec![]))
    );
    assert_eq!(
        r.changes_since(&alice, v4 + 10).await.unwrap(),
        None,
        "unknown version"
    );
    // Re-adding a removed contact resurrects it.
    r.put_item(&alice, &carol).await.unwrap();
    assert_eq!(r.count(&alice).await.unwrap(), 2);
    // Rosters are per owner.
    assert_eq!(
        r.get_roster(&jid("bob@example.org")).await.unwrap().1,
        vec![]
    );

    // One contact's item in many owners' rosters at once: owners on two
    // domains, one without the contact, one whose item is a tombstone,
    // one named twice.
    let other = jid("robert);delete_from_roster_items;--@other.example");
    let mut carol_for_other = carol.clone();
    carol_for_other.name = Some("C".into());
    r.put_item(&other, &carol_for_other).await.unwrap();
    let erin = jid("erin@example.org");
    r.put_item(&erin, &carol).await.unwrap();
    r.remove_item(&erin, &carol.jid).await.unwrap();
    let owners = [
        alice.clone(),
        jid("bob@example.org"),
        erin.clone(),
        other.clone(),
        alice.clone(),
    ];
    let mut found = r.items_for_contact(&owners, &carol.jid).await.unwrap();
    found.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    found.dedup();
    assert_eq!(
        found,
        [
            (alice.clone(), carol.clone()),
            (other.clone(), carol_for_other)
        ]
    );
    assert!(r
        .items_for_contact(&[], &carol.jid)
        .await
        .unwrap()
        .is_empty());
    r.remove_user(&other).await.unwrap();
    r.remove_user(&erin).await.unwrap();

    // Pending subscription requests (RFC 6121 §3.1.3).
    let dave = jid("dave@example.org");
    r.put_pending_request(&alice, &dave, "<presence type='subscribe'/>")
        .await
        .unwrap();
    r.put_pending_request(
        &alice,
        &dave,
        "<presence type='subscribe'><status>hi</status></presence>",
    )
    .await
    .unwrap();
    let pending = r.pending_requests(&alice).await.unwrap();
    assert_eq!(pending.len(), 1, "one request per contact, latest kept");
    assert!(pending[0].1.contains("hi"));
    assert!(r.has_pending_request(&alice, &dave).await.unwrap());
    assert!(
        !r.has_pending_request(&dave, &alice).await.unwrap(),
        "directed"
    );
    assert!(!r.has_pending_request(&alice, &alice).await.unwrap());
    r.remove_pending_request(&alice, &dave).await.unwrap();
    assert!(r.pending_requests(&alice).await.unwrap().is_empty());
    assert!(!r.has_pending_request(&alice, &dave).await.unwrap());

    r.remove_user(&alice).await.unwrap();
    assert_eq!(r.get_roster(&alice).await.unwrap(), (0, vec![]));
}
