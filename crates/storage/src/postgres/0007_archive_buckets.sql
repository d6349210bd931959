-- The by-conversation archive index leads with a bucket: consecutive runs
-- of about a million archived rows (see `shared/buckets.rs` and the
-- SQLite script of this step for why). New rows land in the newest
-- bucket's part of the index only, so the cost of an insert no longer
-- grows with the archive.
ALTER TABLE archive ADD COLUMN bucket BIGINT NOT NULL DEFAULT 0;
CREATE TABLE archive_buckets (
    bucket   BIGINT PRIMARY KEY,
    first_id BIGINT NOT NULL
);
INSERT INTO archive_buckets (bucket, first_id) VALUES (0, 0);
DROP INDEX archive_by_with;
CREATE INDEX archive_by_with ON archive (bucket, domain, username, with_bare, id) INCLUDE (origin_id);
