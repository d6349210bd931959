//! The inbox (XEP-0430).

use super::{creds, jid};
use starling_core::storage::{
    ArchiveId, ArchiveRecord, InboxQuery, InboxTotals, InboxUpdate, Storage, UnreadChange,
    FLAG_BODY,
};
use starling_proto::BareJid;

fn upd(owner: &BareJid, remote: &str, last: Option<i64>, unread: UnreadChange) -> InboxUpdate {
    InboxUpdate {
        owner: owner.clone(),
        remote: remote.to_owned(),
        last: last.map(|t| ArchiveId::from_parts(t, 0)),
        unread,
        shared: false,
    }
}

/// An archived message of `owner` with `remote` at time `t` (node 0).
fn archived(owner: &BareJid, remote: &str, t: i64) -> ArchiveRecord {
    ArchiveRecord {
        owner: owner.clone(),
        id: ArchiveId::from_parts(t, 0),
        with_bare: remote.to_owned(),
        remote: remote.to_owned(),
        outgoing: false,
        origin_id: None,
        flags: FLAG_BODY,
        stanza: format!("<message id='{t}'/>"),
    }
}

/// Inbox (XEP-0430): upserts in order, unread arithmetic, updates without
/// a message touching only existing rows, newest-first listing with paging
/// and unread-only, the last message joined from the owner's archive (so a
/// tombstone shows; a purged message is `None`), totals, removal, isolation
/// and account deletion.
pub async fn inbox(s: &Storage) {
    let i = s.inbox.as_ref();
    let alice = jid("alice@example.org");
    let bob = jid("bob@example.org");
    // Alice's archive holds the messages the updates point at (bob's
    // archive does not: the join is per owner).
    s.archive
        .append(&[
            archived(&alice, "bob@example.org", 1),
            archived(&alice, "carol@example.org", 2),
            archived(&alice, "bob@example.org", 3),
        ])
        .await
        .unwrap();
    assert_eq!(i.totals(&alice).await.unwrap(), InboxTotals::default());
    i.apply(&[
        upd(&alice, "bob@example.org", Some(1), UnreadChange::Add(1)),
        upd(&alice, "carol@example.org", Some(2), UnreadChange::Add(1)),
        upd(&alice, "bob@example.org", Some(3), UnreadChange::Add(1)),
        upd(&alice, "dave@example.org", Some(4), UnreadChange::Set(0)),
        // No message and no row: nothing is created.
        upd(&alice, "eve@example.org", None, UnreadChange::Set(0)),
        upd(&bob, "alice@example.org", Some(3), UnreadChange::Set(0)),
        upd(
            &alice,
            "'; DROP TABLE inbox; --",
            Some(0),
            UnreadChange::Add(2),
        ),
    ])
    .await
    .unwrap();
    let all = InboxQuery {
        limit: 10,
        ..Default::default()
    };
    let l = i.list(&alice, &all).await.unwrap();
    let names: Vec<&str> = l.iter().map(|e| e.remote.as_str()).collect();
    assert_eq!(
        names,
        [
            "dave@example.org",
            "bob@example.org",
            "carol@example.org",
            "'; DROP TABLE inbox; --"
        ]
    );
    assert_eq!(l[1].unread, 2);
    assert_eq!(l[1].last_stanza.as_deref(), Some("<message id='3'/>"));
    assert_eq!(
        l[0].last_stanza, None,
        "dave's message is not in the archive"
    );
    assert_eq!(l[1].last_id, ArchiveId::from_parts(3, 0));
    assert_eq!(
        i.totals(&alice).await.unwrap(),
        InboxTotals {
            conversations: 4,
            unread_conversations: 3,
            unread_messages: 5
        }
    );
    // Paging: newest first, `before` the last id of a page.
    let p1 = i
        .list(
            &alice,
            &InboxQuery {
                limit: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p1.len(), 2);
    let p2 = i
        .list(
            &alice,
            &InboxQuery {
                limit: 2,
                before: Some(p1[1].last_id),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        p2.iter().map(|e| e.remote.as_str()).collect::<Vec<_>>(),
        ["carol@example.org", "'; DROP TABLE inbox; --"]
    );
    let back = i
        .list(
            &alice,
            &InboxQuery {
                limit: 1,
                after: Some(p2[0].last_id),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        back[0].remote, "bob@example.org",
        "the page just newer than carol"
    );
    let unread = i
        .list(
            &alice,
            &InboxQuery {
                limit: 10,
                unread_only: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(unread.len(), 3);
    // Reset without a message; an older message does not replace a newer one.
    i.apply(&[
        upd(&alice, "bob@example.org", None, UnreadChange::Set(0)),
        upd(&alice, "carol@example.org", Some(1), UnreadChange::Keep),
    ])
    .await
    .unwrap();
    assert_eq!(
        i.get(&alice, "bob@example.org")
            .await
            .unwrap()
            .unwrap()
            .unread,
        0
    );
    let carol = i.get(&alice, "carol@example.org").await.unwrap().unwrap();
    assert_eq!(
        (carol.last_id, carol.unread),
        (ArchiveId::from_parts(2, 0), 1)
    );
    // Changes that come with an older message than the conversation's
    // newest leave the count alone: in a cluster, a reply's reset (from
    // the owner's node) may be written before the count of a message
    // that preceded it (from the sender's node); and a batch written
    // twice counts once.
    let frank = "frank@example.org";
    let alice_ref = &alice;
    let unread_of = |remote: &'static str| async move {
        i.get(alice_ref, remote).await.unwrap().unwrap().unread
    };
    i.apply(&[upd(&alice, frank, Some(10), UnreadChange::Set(0))])
        .await
        .unwrap();
    i.apply(&[upd(&alice, frank, Some(9), UnreadChange::Add(1))])
        .await
        .unwrap();
    assert_eq!(unread_of(frank).await, 0, "the older message was read");
    i.apply(&[upd(&alice, frank, Some(11), UnreadChange::Add(1))])
        .await
        .unwrap();
    i.apply(&[upd(&alice, frank, Some(11), UnreadChange::Add(1))])
        .await
        .unwrap();
    assert_eq!(unread_of(frank).await, 1, "a newer message counts once");
    i.apply(&[upd(&alice, frank, Some(10), UnreadChange::Set(0))])
        .await
        .unwrap();
    assert_eq!(
        unread_of(frank).await,
        1,
        "an older reset does not clear it"
    );
    assert!(i.remove(&alice, frank).await.unwrap());
    // A retraction's tombstone in the archive is what the inbox shows.
    assert!(s
        .archive
        .replace(&alice, ArchiveId::from_parts(3, 0), "<t/>")
        .await
        .unwrap());
    assert_eq!(
        i.get(&alice, "bob@example.org")
            .await
            .unwrap()
            .unwrap()
            .last_stanza
            .as_deref(),
        Some("<t/>")
    );
    assert_eq!(
        i.get(&bob, "alice@example.org")
            .await
            .unwrap()
            .unwrap()
            .last_stanza,
        None,
        "never another owner's archive row"
    );
    // Groups: a room's archive holds the message once; a member's row
    // marked shared points into it, an unmarked one does not.
    let room = jid("room@conference.example.org");
    s.archive
        .append(&[archived(&room, "carol@example.org", 50)])
        .await
        .unwrap();
    let shared = |owner: &BareJid, unread| InboxUpdate {
        shared: true,
        ..upd(owner, "room@conference.example.org", Some(50), unread)
    };
    // (delivered twice, e.g. replayed after a crash: counted once)
    for _ in 0..2 {
        i.apply(&[shared(&alice, UnreadChange::Add(1))])
            .await
            .unwrap();
    }
    i.apply(&[upd(
        &bob,
        "room@conference.example.org",
        Some(50),
        UnreadChange::Add(1),
    )])
    .await
    .unwrap();
    let g = i
        .get(&alice, "room@conference.example.org")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(g.last_stanza.as_deref(), Some("<message id='50'/>"));
    assert_eq!(g.unread, 1, "the same message counts once");
    let listed = i.list(&alice, &all).await.unwrap();
    assert_eq!(listed[0].remote, "room@conference.example.org");
    assert_eq!(listed[0].last_stanza.as_deref(), Some("<message id='50'/>"));
    assert_eq!(
        i.get(&bob, "room@conference.example.org")
            .await
            .unwrap()
            .unwrap()
            .last_stanza,
        None,
        "an unmarked row never shows another archive's message"
    );
    assert!(i
        .remove(&alice, "room@conference.example.org")
        .await
        .unwrap());
    assert!(i.remove(&bob, "room@conference.example.org").await.unwrap());
    // Removal and isolation.
    assert!(i.remove(&alice, "dave@example.org").await.unwrap());
    assert!(!i.remove(&alice, "dave@example.org").await.unwrap());
    assert_eq!(i.totals(&bob).await.unwrap().conversations, 1);
    s.accounts.create(&alice, &creds("pw")).await.unwrap();
    assert!(s.delete_account(&alice).await.unwrap());
    assert_eq!(i.totals(&alice).await.unwrap().conversations, 0);
    assert_eq!(i.totals(&bob).await.unwrap().conversations, 1);
}
