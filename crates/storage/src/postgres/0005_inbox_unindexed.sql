-- The inbox loses its (owner, last_id) index (see the SQLite migration of
-- the same version for why). On PostgreSQL it also makes the per-message
-- inbox update a HOT update: no indexed column changes any more, so the
-- new row version stays on its page and no index entry is written.
DROP INDEX IF EXISTS inbox_by_last;
-- Room on each page for the updated row versions, so updates stay HOT
-- (applies to pages written from now on).
ALTER TABLE inbox SET (fillfactor = 70);
