-- A status event that answers one submission, the order's "received" or
-- a submit's "rejected", carries that submission's AMQP correlation_id
-- back, so that an application that posted the same order id twice knows
-- which post each answer is for. Every other event has none.
ALTER TABLE outbox ADD COLUMN correlation_id text;
