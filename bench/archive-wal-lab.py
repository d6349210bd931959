#!/usr/bin/env python3
"""Issue 9's archive + inbox write path on SQLite, without the server.

A model, not the server: it replays by hand the statements the server's
SQLite backend runs for the archive and inbox write-behind batches
(crates/storage/src/sqlite/dialect.rs: one archive batch and one inbox
batch every 0.5 s of simulated time, a checkpoint every simulated second)
as fast as it can, for RATE messages a second between 2,000 users with
random partners, and reports the WAL frames (pages written) per message,
which do not depend on how busy the machine is, and the CPU per message,
which does. Used to find where the growth from an empty archive to a
10-million-message one came from (docs/benchmarks.md, 2026-11-27).

  bench/archive-wal-lab.py DB SECONDS [RATE] [log<N>]

DB: a copy of a database with Starling's schema (bench/archive-prefill.sh
fills one); it is written to. log<N>: model the inbox log
(crates/storage/src/sqlite/inbox_log.rs) merged every N pending updates,
instead of the in-place upserts. Environment: MMAP (SQLite mmap_size).
"""
import os, random, sqlite3, sys, time, resource

db, secs = sys.argv[1], int(sys.argv[2])
rate = int(sys.argv[3]) if len(sys.argv) > 3 else 6000
variants = set(sys.argv[4:])
USERS = 2000
BUCKET_ROWS = 1 << 20

def connect():
    c = sqlite3.connect(db, isolation_level=None)
    for p in ["journal_mode=WAL", "synchronous=NORMAL", "cache_size=-32768",
              "mmap_size=" + os.environ.get("MMAP", "1073741824"), "wal_autocheckpoint=0", "temp_store=memory"]:
        c.execute("PRAGMA " + p).fetchall()
    return c

w, ck = connect(), connect()
max_id = w.execute("SELECT COALESCE(MAX(id),0) FROM archive").fetchone()[0]
bucket = w.execute("SELECT MAX(bucket) FROM archive_buckets").fetchone()[0]
in_bucket = w.execute("SELECT COUNT(*) FROM archive WHERE bucket=?", (bucket,)).fetchone()[0]
has_log = any(v.startswith('log') for v in variants)
MERGE_AT = int(next((v[3:] for v in variants if v.startswith('log')), '0') or 0)
mem = {}
if has_log:
    w.execute('CREATE TABLE IF NOT EXISTS inbox_log_model (seq INTEGER PRIMARY KEY, domain TEXT, username TEXT, remote TEXT, last_id INTEGER, op INTEGER, n INTEGER)')
owner_bucket = "ob" in variants
print(f"start: max_id={max_id} bucket={bucket} rows_in_bucket={in_bucket} variants={variants}")
next_id = max(max_id >> 8, int(time.time() * 1e6)) + 1
rnd = random.Random(1)

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

f_arch = f_inbox = 0
def walf():
    try: return os.path.getsize(db + '-wal') // 4120
    except FileNotFoundError: return 0
t_arch = t_inbox = t_ck = t_merge = 0.0
frames = 0
msgs = 0
per_batch = rate // 2
for step in range(secs * 2):
    rows, inbox = [], {}
    for _ in range(per_batch):
        a = rnd.randrange(1, USERS + 1)
        b = rnd.randrange(1, USERS)
        b = b + 1 if b >= a else b
        oid = next_id; next_id += 1
        iid = next_id; next_id += 1
        stanza = f"<message xmlns='jabber:client' id='m{oid}' to='user{b}@localhost' type='chat' from='user{a}@localhost/bench'><body>{oid} </body></message>"
        rows.append((oid << 8, "localhost", f"user{a}", f"user{b}@localhost", f"user{b}@localhost", 1, f"m{oid}", 1, stanza, bucket))
        rows.append((iid << 8, "localhost", f"user{b}", f"user{a}@localhost", f"user{a}@localhost/bench", 0, f"m{oid}", 1, stanza, bucket))
        # sender's conversation: set 0; recipient's: add 1
        inbox[(f"user{a}", f"user{b}@localhost")] = ("set", 0, oid << 8)
        k = (f"user{b}", f"user{a}@localhost")
        prev = inbox.get(k)
        inbox[k] = ("add", (prev[1] if prev and prev[0] == "add" else 0) + 1, iid << 8) if not prev or prev[0] == "add" else ("set", prev[1] + 1, iid << 8)
    msgs += per_batch
    c0 = cpu(); w0 = walf()
    w.execute("BEGIN IMMEDIATE")
    w.execute("SELECT bucket, first_id FROM archive_buckets WHERE first_id > ? OR bucket = (SELECT MAX(bucket) FROM archive_buckets WHERE first_id <= ?) ORDER BY bucket", (rows[0][0], rows[0][0])).fetchall()
    for i in range(0, len(rows), 200):
        chunk = rows[i:i + 200]
        w.execute("INSERT OR IGNORE INTO archive (id, domain, username, with_bare, remote, outgoing, origin_id, flags, stanza, bucket) VALUES "
                  + ",".join(["(?,?,?,?,?,?,?,?,?,?)"] * len(chunk)), [v for r in chunk for v in r])
    w.execute("COMMIT")
    in_bucket += len(rows)
    c1 = cpu(); t_arch += c1 - c0; w1 = walf(); f_arch += w1 - w0
    adding = [(k, v) for k, v in inbox.items() if v[0] == "add"]
    setting = [(k, v) for k, v in inbox.items() if v[0] == "set"]
    w.execute("BEGIN IMMEDIATE")
    if has_log:
        items = list(inbox.items())
        for i in range(0, len(items), 200):
            chunk = items[i:i + 200]
            w.execute("INSERT INTO inbox_log_model (domain, username, remote, last_id, op, n) VALUES "
                      + ",".join(["(?,?,?,?,?,?)"] * len(chunk)),
                      [v for (k, (op, n, lid)) in chunk for v in ("localhost", k[0], k[1], lid, 1 if op == "set" else 0, n)])
        for k, v in items:
            p = mem.get(k)
            if p is None or v[0] == "set": mem[k] = v
            else: mem[k] = (p[0], p[1] + v[1], v[2])
    else:
        for group, unread_sql in [(adding, "CASE WHEN excluded.last_id > last_id THEN unread + excluded.unread ELSE unread END"),
                                  (setting, "CASE WHEN excluded.last_id >= last_id THEN excluded.unread ELSE unread END")]:
            for i in range(0, len(group), 200):
                chunk = group[i:i + 200]
                w.execute("INSERT INTO inbox (domain, username, remote, last_id, unread, shared) VALUES "
                          + ",".join(["(?,?,?,?,?,?)"] * len(chunk))
                          + " ON CONFLICT (domain, username, remote) DO UPDATE SET last_id = MAX(last_id, excluded.last_id), shared = CASE WHEN excluded.last_id >= last_id THEN excluded.shared ELSE shared END, unread = " + unread_sql,
                          [v for (k, (op, n, lid)) in chunk for v in ("localhost", k[0], k[1], lid, n, 0)])
    w.execute("COMMIT")
    c2 = cpu(); t_inbox += c2 - c1; f_inbox += walf() - w1
    if has_log and len(mem) >= MERGE_AT:
        keys = sorted(mem)
        for i in range(0, len(keys), 10000):
            w.execute("BEGIN IMMEDIATE")
            part = [(k, mem[k]) for k in keys[i:i+10000]]
            for group, unread_sql in [([x for x in part if x[1][0] == "add"], "CASE WHEN excluded.last_id > last_id THEN unread + excluded.unread ELSE unread END"),
                                      ([x for x in part if x[1][0] == "set"], "CASE WHEN excluded.last_id >= last_id THEN excluded.unread ELSE unread END")]:
                for j in range(0, len(group), 200):
                    chunk = group[j:j + 200]
                    w.execute("INSERT INTO inbox (domain, username, remote, last_id, unread, shared) VALUES "
                          + ",".join(["(?,?,?,?,?,?)"] * len(chunk))
                          + " ON CONFLICT (domain, username, remote) DO UPDATE SET last_id = MAX(last_id, excluded.last_id), shared = CASE WHEN excluded.last_id >= last_id THEN excluded.shared ELSE shared END, unread = " + unread_sql,
                          [v for (k, (op, n, lid)) in chunk for v in ("localhost", k[0], k[1], lid, n, 0)])
            w.execute("COMMIT")
        w.execute("DELETE FROM inbox_log_model")
        mem.clear()
        c3 = cpu(); t_merge += c3 - c2; c2 = c3
    if step % 2 == 1:
        r = ck.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        frames += r[1]
        ck.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        t_ck += cpu() - c2
tot = t_arch + t_inbox + t_ck + t_merge
r = resource.getrusage(resource.RUSAGE_SELF)
print(f"user={r.ru_utime:.1f}s sys={r.ru_stime:.1f}s majflt={r.ru_majflt} minflt={r.ru_minflt}")
print(f"msgs={msgs} frames/msg={frames/msgs:.3f} archive={f_arch/msgs:.3f} inbox={f_inbox/msgs:.3f} cpu us/msg: archive={t_arch/msgs*1e6:.1f} inbox={t_inbox/msgs*1e6:.1f} merge={t_merge/msgs*1e6:.1f} checkpoint={t_ck/msgs*1e6:.1f} total={tot/msgs*1e6:.1f}")
