#!/usr/bin/env bash
# Fills a Starling SQLite database with the archive and inbox that issue 9's
# workload leaves behind after MESSAGES messages: USERS users user1..userN
# on `localhost`, each message from a pseudo-random user to another one,
# archived twice (the sender's outgoing row, the recipient's incoming row),
# and one inbox row per conversation. The ids are time-ordered and end a
# few seconds before now, so messages archived by a server started on the
# database afterwards come after them, as in a long run.
#
#   bench/archive-prefill.sh DB USERS MESSAGES
#
# The database must exist with Starling's schema (any `starling user …`
# command creates it); the server must not be running. Needs the sqlite3
# command-line shell. 10,000,000 messages take a few minutes and ~10 GB.
set -euo pipefail
db=$1
users=$2
messages=$3
command -v sqlite3 >/dev/null || { echo "archive-prefill: needs sqlite3 (apt-get install sqlite3)" >&2; exit 1; }
[[ -f "$db" ]] || { echo "archive-prefill: $db does not exist; create it with 'starling user import' first" >&2; exit 1; }
rows=$((messages * 2))
now_us=$(($(date +%s%N) / 1000))
# 100 µs of id space per row, ending 10 s ago.
first_us=$((now_us - 10000000 - rows * 100))
log() { echo "[archive-prefill $(date +%H:%M:%S)] $*" >&2; }
log "$messages messages between $users users into $db"
# Row k belongs to message m = k/2; k even is the sender's outgoing copy,
# k odd the recipient's incoming one. Sender and recipient come from an
# integer hash of m (multiply and xor-shift rounds; SQLite has no xor, so
# x ^ y is spelled (x | y) - (x & y)), so both rows of a message agree
# without a temporary table, and the pairs spread over all USERS × (USERS-1)
# conversations as random partners do. Rows are filed in buckets of 2^20,
# as the server does (crates/storage/src/buckets.rs), when the schema has
# them.
if sqlite3 "$db" "SELECT 1 FROM pragma_table_info('archive') WHERE name = 'bucket'" | grep -q 1; then
    bucket_col="bucket,"
    bucket_val="k / 1048576,"
    bucket_bounds="INSERT OR IGNORE INTO archive_buckets (bucket, first_id)
SELECT bucket, MIN(id) FROM archive WHERE bucket > 0 GROUP BY bucket;"
else
    bucket_col="" bucket_val="" bucket_bounds=""
fi
mix() { # SQL expression: 32-bit hash of the SQL expression $1 (every
    # product stays below 2^63: SQLite turns an overflowing integer into a
    # float)
    local x="(($1) * 73244475 + 12345) % 4294967296"
    x="((($x) | (($x) >> 16)) - (($x) & (($x) >> 16)))"
    x="(($x) * 73244475) % 4294967296"
    x="((($x) | (($x) >> 16)) - (($x) & (($x) >> 16)))"
    x="(($x) * 73244475) % 4294967296"
    echo "((($x) | (($x) >> 16)) - (($x) & (($x) >> 16)))"
}
sqlite3 "$db" <<SQL
PRAGMA journal_mode = WAL;
PRAGMA synchronous = OFF;
PRAGMA cache_size = -4000000;
BEGIN;
WITH RECURSIVE g(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM g WHERE k < $rows - 1),
h AS (SELECT k, k % 2 AS incoming, $(mix "(k / 2) * 2") AS ha, $(mix "(k / 2) * 2 + 1") AS hb FROM g),
p AS (SELECT k, incoming, ha % $users + 1 AS a, hb % ($users - 1) + 1 AS b0 FROM h),
q AS (SELECT k, incoming, a, CASE WHEN b0 >= a THEN b0 + 1 ELSE b0 END AS b FROM p)
INSERT INTO archive (id, $bucket_col domain, username, with_bare, remote, outgoing, origin_id, flags, stanza)
SELECT ($first_us + k * 100) * 256,
       $bucket_val
       'localhost',
       'user' || CASE incoming WHEN 0 THEN a ELSE b END,
       'user' || CASE incoming WHEN 0 THEN b ELSE a END || '@localhost',
       CASE incoming WHEN 0 THEN 'user' || b || '@localhost' ELSE 'user' || a || '@localhost/bench' END,
       1 - incoming,
       'm' || (k / 2),
       1,
       printf('<message xmlns=''jabber:client'' id=''m%d'' to=''user%d@localhost'' type=''chat'' from=''user%d@localhost/bench''><body>%d </body></message>',
              k / 2, b, a, 1795606797356297 + k)
FROM q;
$bucket_bounds
COMMIT;
BEGIN;
INSERT INTO inbox (domain, username, remote, last_id, unread)
SELECT domain, username, with_bare, MAX(id), 0 FROM archive
GROUP BY domain, username, with_bare
ON CONFLICT DO NOTHING;
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
log "done: $(sqlite3 "$db" 'SELECT COUNT(*) FROM archive') archive rows, $(sqlite3 "$db" 'SELECT COUNT(*) FROM inbox') inbox rows, $(du -sh "$db" | cut -f1)"
