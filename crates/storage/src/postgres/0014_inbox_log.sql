-- Schema step 14 ("inbox-log") is SQLite's: an append-only log of inbox
-- updates merged into `inbox` in key order (`sqlite/inbox_log.rs`).
-- PostgreSQL writes the updates to `inbox` directly; nothing changes here.
SELECT 1;
