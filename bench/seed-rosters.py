#!/usr/bin/env python3
"""Writes rosters straight into a stopped Starling's SQLite database, for
benchmarks that need users with contacts (e.g. `starling-bench resume
--full-login`): users user1..userN of DOMAIN in groups of CONTACTS + 1
consecutive users, each the others' contact with subscription `both` --
the layout the `pep` scenario builds over XMPP, without its minutes of
subscription round trips. Lab tool only: it bypasses the server (run it
on a database no server has open).

usage: bench/seed-rosters.py DB USERS CONTACTS [DOMAIN]
"""
import sqlite3
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    db, users, contacts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    domain = sys.argv[4] if len(sys.argv) > 4 else "localhost"
    group = contacts + 1
    con = sqlite3.connect(db)
    items, versions = [], []
    for n in range(1, users + 1):
        start = (n - 1) // group * group + 1
        members = range(start, min(start + group, users + 1))
        for m in members:
            if m != n:
                items.append((domain, f"user{n}", f"user{m}@{domain}", "both", 0, 0, 0, "", 1, 0))
        versions.append((domain, f"user{n}", 1))
    with con:
        con.executemany(
            "INSERT OR REPLACE INTO roster_items (domain, username, contact, subscription, ask,"
            " pending_in, approved, groups, version, removed, name) VALUES (?,?,?,?,?,?,?,?,?,?,NULL)",
            items,
        )
        con.executemany(
            "INSERT OR REPLACE INTO roster_versions (domain, username, version) VALUES (?,?,?)",
            versions,
        )
    print(f"seed-rosters: {len(items)} roster items for {users} users ({contacts} contacts each) in {db}")


if __name__ == "__main__":
    main()
