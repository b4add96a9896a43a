-- The outbox in one index: its primary key on id.
--
-- Since 0016 every message leaves the outbox once the broker confirmed it
-- (operator alerts are kept in the alerts table), so every row in the
-- outbox is unpublished and the relay reads and deletes them in id order.
-- Each message went into two indexes: the primary key on message_id,
-- which nothing looks a row up by, and the unpublished messages' index on
-- id. Now it goes into one, on id, appended at the right edge of the tree.
-- message_id is still written (a random UUID per message, the id on the
-- wire, and the alerts table's key for an alert).
--
-- published_at is no longer set by anything; it stays so that a relay of
-- the release before, still running during an upgrade, finds the column
-- its statements name.
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey;
DROP INDEX outbox_unpublished_idx;
ALTER TABLE outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);
