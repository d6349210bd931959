-- Groups in the inbox (XEP-0430 with XEP-0045 rooms): a group chat room
-- archives each message once, under the room's JID, and every member's
-- inbox row for the room points into the room's archive. `shared` marks
-- such rows; listings join the owner's archive for the others, so a row
-- never shows another owner's message (conformance: inbox).
ALTER TABLE inbox ADD COLUMN shared BOOLEAN NOT NULL DEFAULT FALSE;
