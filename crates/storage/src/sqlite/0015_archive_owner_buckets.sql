-- The by-owner archive index leads with the bucket too, like the
-- by-conversation one (step 7, `buckets.rs`). It used to put every new row
-- at the end of its owner's range, one page per active owner in an index
-- as large as the archive; with the bucket first, new rows land in the
-- newest bucket's part, as on an empty archive. Queries of an owner's
-- whole archive visit buckets as `with` queries do. Rebuilding the index
-- takes minutes on an archive of tens of millions of rows.
DROP INDEX archive_by_owner;
CREATE INDEX archive_by_owner ON archive (bucket, domain, username, id);
