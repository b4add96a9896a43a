package statestore

import (
	"context"
	"fmt"
	"time"
)

// StepStats is a picture of the live work in the store.
type StepStats struct {
	// ByState counts the steps pending, processing and in error, the last
	// only of orders held in error: those that need an operator (the
	// failed step of an order that was undone stays in error after it
	// ended). Other states are not counted: waiting, processed and
	// cancelled rows pile up with history, and counting them means
	// reading the whole table.
	ByState map[string]int
	// OldestPending is how long the longest-waiting due pending step has
	// been due; OldestProcessing how long the oldest processing step has
	// been claimed. Zero when there is none.
	OldestPending    time.Duration
	OldestProcessing time.Duration
	// OpenAlerts counts the operator alerts that still need a person:
	// not acknowledged, and their order has not ended since;
	// OpenAlertsIn counts them by their order's namespace, with every
	// namespace of the deployment (0 for one with none).
	OpenAlerts   int
	OpenAlertsIn map[string]int
	// InFlightIn are each namespace's orders in flight (received,
	// processing, compensating, held in error) and its quota of them.
	InFlightIn map[string]NamespaceLoad
}

// NamespaceLoad is a namespace's orders in flight, and its quota of them
// (nil: none).
type NamespaceLoad struct {
	InFlight    int
	MaxInFlight *int
}

// The pending steps are read in the two halves the partial indexes hold
// them in (unkeyed and keyed, migration 0032): no index holds them all.
const statsSQL = `SELECT
	(SELECT count(*) FROM steps WHERE process_state = 'pending' AND fair_key IS NULL)
	  + (SELECT count(*) FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL),
	(SELECT count(*) FROM steps WHERE process_state = 'processing'),
	(SELECT count(*) FROM orders o JOIN steps s ON s.order_id = o.order_id AND s.process_state = 'error' WHERE o.status = 'error'),
	coalesce((SELECT (extract(epoch FROM now() - least(
	              (SELECT min(available_at) FROM steps WHERE process_state = 'pending' AND fair_key IS NULL AND available_at <= now()),
	              (SELECT min(available_at) FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL AND available_at <= now()))) * 1000)::bigint), 0),
	coalesce((SELECT (extract(epoch FROM now() - min(CASE WHEN held_attempt = attempt THEN held_since ELSE complete_by - timeout END)) * 1000)::bigint
	          FROM steps WHERE process_state = 'processing'), 0),
	(SELECT jsonb_object_agg(n.name, coalesce(x.open, 0)) FROM namespaces n LEFT JOIN (` + openAlertsByNamespaceSQL + `) x ON x.ns = n.name),
	(SELECT jsonb_object_agg(n.name, jsonb_build_array(coalesce(x.n, 0), n.max_in_flight)) FROM namespaces n
	 LEFT JOIN (SELECT namespace AS ns, count(*) AS n FROM orders WHERE status IN ('received', 'processing', 'compensating', 'error')
	            GROUP BY 1) x ON x.ns = n.name)`

// LiveStates are the states Stats counts.
var LiveStates = []string{StepPending, StepProcessing, StepError}

// Stats counts live steps by state and measures the oldest pending and
// processing work, on the database clock. Each count reads only its state's
// partial index, so its cost follows the live work, not the history.
func (s *Store) Stats(ctx context.Context) (StepStats, error) {
	st := StepStats{ByState: map[string]int{}}
	var pending, processing, errored int
	var pendingMS, processingMS int64
	var loads map[string][2]*int
	err := s.pool.QueryRow(ctx, statsSQL).Scan(&pending, &processing, &errored, &pendingMS, &processingMS, &st.OpenAlertsIn, &loads)
	if err != nil {
		return st, fmt.Errorf("step stats: %w", err)
	}
	st.InFlightIn = make(map[string]NamespaceLoad, len(loads))
	for ns, l := range loads {
		var n int
		if l[0] != nil {
			n = *l[0]
		}
		st.InFlightIn[ns] = NamespaceLoad{InFlight: n, MaxInFlight: l[1]}
	}
	for _, n := range st.OpenAlertsIn {
		st.OpenAlerts += n
	}
	st.ByState[StepPending], st.ByState[StepProcessing], st.ByState[StepError] = pending, processing, errored
	st.OldestPending = time.Duration(pendingMS) * time.Millisecond
	st.OldestProcessing = time.Duration(processingMS) * time.Millisecond
	return st, nil
}

// CountOrders counts the orders in any of statuses; with none, every
// order.
func (s *Store) CountOrders(ctx context.Context, statuses ...string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE coalesce(cardinality($1::text[]), 0) = 0 OR status::text = ANY($1)`, statuses).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count orders: %w", err)
	}
	return n, nil
}
