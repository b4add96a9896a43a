package statestore

import (
	"context"
	"fmt"
	"time"
)

// StepStats is a picture of the work in the store.
type StepStats struct {
	// ByState counts steps per process_state.
	ByState map[string]int
	// OldestPending is how long the longest-waiting due pending step has
	// been due; OldestProcessing how long the oldest processing step has
	// been claimed. Zero when there is none.
	OldestPending    time.Duration
	OldestProcessing time.Duration
}

// Stats counts steps by state and measures the oldest pending and
// processing work, on the database clock.
func (s *Store) Stats(ctx context.Context) (StepStats, error) {
	st := StepStats{ByState: map[string]int{}}
	rows, err := s.pool.Query(ctx, `SELECT process_state, count(*) FROM steps GROUP BY process_state`)
	if err != nil {
		return st, fmt.Errorf("step stats: %w", err)
	}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			rows.Close()
			return st, fmt.Errorf("step stats: %w", err)
		}
		st.ByState[state] = n
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("step stats: %w", err)
	}
	var pendingMS, processingMS int64
	err = s.pool.QueryRow(ctx, `SELECT
		coalesce((SELECT (extract(epoch FROM now() - min(available_at)) * 1000)::bigint
		          FROM steps WHERE process_state = 'pending' AND available_at <= now()), 0),
		coalesce((SELECT (extract(epoch FROM now() - min(complete_by - timeout)) * 1000)::bigint
		          FROM steps WHERE process_state = 'processing'), 0)`).Scan(&pendingMS, &processingMS)
	if err != nil {
		return st, fmt.Errorf("step ages: %w", err)
	}
	st.OldestPending = time.Duration(pendingMS) * time.Millisecond
	st.OldestProcessing = time.Duration(processingMS) * time.Millisecond
	return st, nil
}
