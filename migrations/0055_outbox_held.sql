-- outbox.held_until: a message its writer publishes itself, at once after
-- its commit, instead of leaving it to a relay round (a transaction that
-- reads the outbox, and a second that deletes what was published). The
-- batched reply (internal/statestore/reply.go) holds an ended order's
-- status event so when the outbox held nothing as it began; its
-- scheduler publishes the event and deletes it. Until the hold ends a
-- relay publishes nothing from that message on (it keeps each order's
-- events in order); after, a held message not yet deleted (its writer
-- died or could not publish) is the relay's as any other.
ALTER TABLE outbox ADD COLUMN held_until timestamptz;
