-- The inbox loses its (owner, last_id) index. Every archived message
-- updates two inbox rows (the sender's and the recipient's conversation),
-- and with that index each update also deleted the conversation's old
-- entry — at a random place in the owner's range — and inserted a new
-- one: two more scattered pages written per row, the largest share of the
-- archive path's write amplification once the inbox is big. An inbox
-- page now reads the owner's conversations through the primary key (they
-- are clustered by owner) and sorts them; an owner has thousands of
-- conversations at most, a sort the size of one index scan.
DROP INDEX IF EXISTS inbox_by_last;
