//! Who is whose contact: users in groups, and who publishes the fan-out's
//! publications.

use super::proto::PepNode;
use crate::cli::PepArgs;
use std::collections::HashSet;

/// The users of user `n`'s group (groups of `contacts + 1` consecutive
/// users from `first`; the last one may be smaller).
pub(crate) fn group_of(first: u64, users: u64, contacts: u64, n: u64) -> std::ops::Range<u64> {
    let size = contacts + 1;
    let lo = first + (n - first) / size * size;
    lo..(lo + size).min(first + users)
}

/// The layout and the JIDs.
pub(super) struct Layout {
    pub(super) first: u64,
    pub(super) users: u64,
    pub(super) contacts: u64,
    domain: String,
    pattern: String,
}

impl Layout {
    pub(super) fn of(a: &PepArgs) -> Layout {
        let c = &a.scenario.conn;
        Layout {
            first: c.first_user,
            users: c.users,
            contacts: a.contacts,
            domain: c.domain.to_ascii_lowercase(),
            pattern: c.user_pattern.clone(),
        }
    }

    pub(super) fn jid(&self, n: u64) -> String {
        format!(
            "{}@{}",
            self.pattern
                .replace("{n}", &n.to_string())
                .to_ascii_lowercase(),
            self.domain
        )
    }

    /// User `n`'s contacts: (number, bare JID).
    pub(super) fn contacts_of(&self, n: u64) -> Vec<(u64, String)> {
        group_of(self.first, self.users, self.contacts, n)
            .filter(|&m| m != n)
            .map(|m| (m, self.jid(m)))
            .collect()
    }

    /// The (publisher, node) pairs user `n` should be notified of.
    pub(super) fn expected(&self, n: u64, nodes: &[PepNode]) -> HashSet<(String, String)> {
        group_of(self.first, self.users, self.contacts, n)
            .flat_map(|m| {
                let jid = self.jid(m);
                nodes.iter().map(move |p| (jid.clone(), p.node.to_owned()))
            })
            .collect()
    }

    pub(super) fn groups(&self) -> u64 {
        self.users.div_ceil(self.contacts + 1)
    }

    /// The users of group `g`.
    fn group(&self, g: u64) -> std::ops::Range<u64> {
        group_of(
            self.first,
            self.users,
            self.contacts,
            self.first + g * (self.contacts + 1),
        )
    }
}

/// Fan-out publication `i`'s publisher: the online member of group
/// `i mod groups` at or after its turn (`i / groups`, rotating), and the
/// online members of that group (the expected receivers, itself
/// included); `None` when none is online.
pub(super) fn pick_publisher(
    layout: &Layout,
    i: u64,
    online: impl Fn(u64) -> bool,
) -> Option<(u64, u64)> {
    let group = layout.group(i % layout.groups());
    let size = group.end - group.start;
    let turn = i / layout.groups();
    let publisher = (0..size)
        .map(|k| group.start + (turn + k) % size)
        .find(|&m| online(m))?;
    Some((publisher, group.filter(|&m| online(m)).count() as u64))
}

#[cfg(test)]
mod tests {
    use super::super::tests::args;
    use super::super::NODES;
    use super::*;

    #[test]
    fn fan_out_publishers_rotate_over_groups_and_online_members() {
        // Users 3..10 in groups 3..6, 6..9, 9..10.
        let l = Layout::of(&args(&[
            "--users",
            "7",
            "--first-user",
            "3",
            "--contacts",
            "2",
        ]));
        let all = |_: u64| true;
        let picks: Vec<_> = (0..7).map(|i| pick_publisher(&l, i, all)).collect();
        assert_eq!(
            picks,
            [(3, 3), (6, 3), (9, 1), (4, 3), (7, 3), (9, 1), (5, 3)].map(Some)
        );
        let some = |m: u64| m != 4 && m != 9 && m != 6;
        assert_eq!(pick_publisher(&l, 3, some), Some((5, 2)), "next online");
        assert_eq!(pick_publisher(&l, 1, some), Some((7, 2)));
        assert_eq!(pick_publisher(&l, 2, some), None, "nobody online");
    }

    #[test]
    fn groups_contacts_and_expectations() {
        let a = args(&["--users", "7", "--first-user", "3", "--contacts", "2"]);
        let l = Layout::of(&a);
        assert_eq!(l.groups(), 3);
        assert_eq!(group_of(3, 7, 2, 3), 3..6);
        assert_eq!(group_of(3, 7, 2, 8), 6..9);
        assert_eq!(group_of(3, 7, 2, 9), 9..10, "the last group is smaller");
        assert_eq!(
            l.contacts_of(4),
            vec![
                (3, "user3@localhost".to_string()),
                (5, "user5@localhost".to_string())
            ]
        );
        assert!(l.contacts_of(9).is_empty());
        let e = l.expected(4, &NODES[..2]);
        assert_eq!(e.len(), 6, "3 members (itself included) × 2 nodes");
        assert!(e.contains(&(
            "user4@localhost".into(),
            "http://jabber.org/protocol/nick".into()
        )));
        assert_eq!(l.expected(9, &NODES[..2]).len(), 2, "its own only");
        assert!(l.expected(4, &[]).is_empty());
    }
}
