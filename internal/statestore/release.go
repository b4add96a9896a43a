package statestore

import (
	"context"
	"fmt"
)

// ReleaseClaim hands a claimed step back to pending when its scheduler
// could not send the request (the broker was unreachable), so that it need
// not wait for its complete_by to pass. Fenced like a reply: it changes
// nothing unless attempt is still the step's current, processing attempt.
// failure_count is not incremented: the step never reached an agent. It
// reports whether the step was released.
func (s *Store) ReleaseClaim(ctx context.Context, orderID string, step, attempt int, actor, reason string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE steps
		SET process_state = 'pending', locked_by = NULL, complete_by = NULL,
		    available_at = now(), updated_at = now(),
		    moves = moves + 1, moved_by = $4, moved_why = 'released: ' || $5::text
		WHERE order_id = $1 AND step = $2 AND attempt = $3 AND process_state = 'processing'`, orderID, step, attempt, actor, reason)
	if err != nil {
		return false, fmt.Errorf("release claim of order %s step %d: %w", orderID, step, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseSent hands back to pending every step actor holds processing for
// an agent (a request sent, no service holding it after a 202): what a
// scheduler does when its broker connection came back, with step requests
// and replies transient (docs/RELIABILITY.md), since a broker restart lost
// those in flight. A request that was not lost gets its call made again,
// under the same idempotency key, and its reply is fenced off as stale;
// failure_count is not incremented. It reports how many steps it released.
func (s *Store) ReleaseSent(ctx context.Context, actor, reason string) (int, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE steps
		SET process_state = 'pending', locked_by = NULL, complete_by = NULL,
		    available_at = now(), updated_at = now(),
		    moves = moves + 1, moved_by = $1, moved_why = 'released: ' || $2::text
		WHERE process_state = 'processing' AND locked_by = $1 AND agent <> ''
		  AND held_attempt IS DISTINCT FROM attempt`, actor, reason)
	if err != nil {
		return 0, fmt.Errorf("release the steps %s sent: %w", actor, err)
	}
	return int(tag.RowsAffected()), nil
}
