-- The by-conversation archive index leads with a bucket: consecutive runs
-- of about a million archived rows (see `shared/buckets.rs`). Without it,
-- every archived row was inserted into (owner, peer, id) order at a
-- random place in an index as large as the archive, so each row dirtied
-- a page of its own, and the cost per message grew with the archive
-- (+77% server CPU on a 10-million-message archive). With the bucket
-- first, new rows land in the newest bucket's part of the index only,
-- whose size is bounded; queries with a `with` filter visit the buckets
-- of their id range, newest or oldest first, and stop when the page is
-- full. `archive_buckets` holds where each bucket starts (ids are
-- time-ordered, so a bucket is an id range).
ALTER TABLE archive ADD COLUMN bucket INTEGER NOT NULL DEFAULT 0;
CREATE TABLE archive_buckets (
    bucket   INTEGER PRIMARY KEY,
    first_id INTEGER NOT NULL
);
INSERT INTO archive_buckets (bucket, first_id) VALUES (0, 0);
DROP INDEX archive_by_with;
CREATE INDEX archive_by_with ON archive (bucket, domain, username, with_bare, id, origin_id);
