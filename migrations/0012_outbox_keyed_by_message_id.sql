-- The outbox's primary key is its message_id; the key on id is gone.
--
-- Every outbox message went into three indexes when written (the key on
-- id, the unique message_id, the unpublished messages by id) and into the
-- first two again when marked published. message_id was already unique
-- and is what a message is known by outside; the relay reads and marks
-- only unpublished messages, by id, through the unpublished index. So the
-- key on id only cost: two of the five index entries of every message,
-- about six per three-step order.
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey;
ALTER TABLE outbox DROP CONSTRAINT outbox_message_id_key;
ALTER TABLE outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (message_id);
