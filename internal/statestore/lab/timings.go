package lab

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Latency summarises one distribution of durations.
type Latency struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50_ns"`
	P95  time.Duration `json:"p95_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
}

// Stages of a step's way through the system, in order, as Timings names
// them. The first is per order, the others per processed action step.
const (
	StageSubmitToRow    = "submit -> row"         // placed_at (the publisher's clock) to the order's row
	StageRowToClaim     = "row -> claim"          // the step became pending to its claim
	StageClaimToAgent   = "claim -> agent start"  // the claim to the agent taking the request
	StageRemoteCall     = "remote call"           // the agent's call, retries included
	StageReplyToApplied = "reply -> applied"      // the agent sent the reply to the scheduler applying it
	StageOrder          = "submit -> order ended" // placed_at to the transition that ended the order
)

// Timings is how the orders placed in a window fared, from the state
// store's timestamps (sasctl bench).
type Timings struct {
	// Placed is how many orders placed in the window were written, Ended
	// how many of them ended, by final status.
	Placed int            `json:"placed"`
	Ended  map[string]int `json:"ended"`
	// Completions is how many orders, placed whenever, reached completed
	// inside the window.
	Completions int `json:"completions"`
	// Stages has one entry per Stage constant, StageOrder last.
	Stages []StageLatency `json:"stages"`
}

// StageLatency is one stage's distribution.
type StageLatency struct {
	Stage string `json:"stage"`
	Latency
}

// timingsSQL gathers, for orders placed in [$1, $2), each stage's
// durations in microseconds and summarises them. Claims, applications and
// ends come from the history (the database clock at each transaction's
// start); placed_at and the agent's readings from their own clocks, which
// on one machine is the same clock.
const timingsSQL = `
WITH o AS (
    SELECT order_id, placed_at, created_at, status FROM orders
    WHERE placed_at >= $1 AND placed_at < $2 /*namespace*/
), st AS (
    SELECT s.order_id, s.step, o.created_at, s.agent_started_at, s.agent_call_us, s.agent_sent_at,
           max(t.at) FILTER (WHERE t.to_state = 'pending') AS pending_at,
           max(t.at) FILTER (WHERE t.to_state = 'processing' AND t.attempt = s.attempt) AS claimed_at,
           max(t.at) FILTER (WHERE t.to_state = 'processed' AND t.attempt = s.attempt) AS applied_at
    FROM o
    JOIN steps s ON s.order_id = o.order_id AND s.kind = 'action' AND s.process_state = 'processed'
    JOIN transitions t ON t.order_id = s.order_id AND t.step = s.step
    GROUP BY s.order_id, s.step, o.created_at, s.agent_started_at, s.agent_call_us, s.agent_sent_at
), ends AS (
    SELECT o.order_id, o.placed_at, max(t.at) AS ended_at
    FROM o JOIN transitions t ON t.order_id = o.order_id AND t.step IS NULL AND t.to_state = o.status
    WHERE o.status IN ('completed', 'failed', 'error')
    GROUP BY o.order_id, o.placed_at
), samples AS (
    SELECT 1 AS ord, extract(epoch FROM created_at - placed_at) * 1e6 AS us FROM o
    UNION ALL SELECT 2, extract(epoch FROM claimed_at - coalesce(pending_at, created_at)) * 1e6 FROM st
    UNION ALL SELECT 3, extract(epoch FROM agent_started_at - claimed_at) * 1e6 FROM st WHERE agent_started_at IS NOT NULL
    UNION ALL SELECT 4, agent_call_us FROM st WHERE agent_call_us IS NOT NULL
    UNION ALL SELECT 5, extract(epoch FROM applied_at - agent_sent_at) * 1e6 FROM st WHERE agent_sent_at IS NOT NULL
    UNION ALL SELECT 6, extract(epoch FROM ended_at - placed_at) * 1e6 FROM ends
)
SELECT ord, count(*),
       percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY us),
       max(us), avg(us)
FROM samples WHERE us IS NOT NULL GROUP BY ord ORDER BY ord`

// ReadTimings reports on the orders placed in [from, to) (of namespace,
// when it is not ""): their end states, each stage's latency
// distribution, and the completions inside the window (of orders of every
// namespace created up to ten minutes before it).
//
// It first brings the tables' statistics up to date (a bench's store has
// just been written, and autovacuum may be off: a plan that guessed two
// processed steps joined every step to every order of the window, for
// many minutes), then reads in one transaction with sequential scans off:
// the window's orders are found by their keys, whatever a store behind a
// history of millions of orders holds.
func ReadTimings(ctx context.Context, pool *pgxpool.Pool, from, to time.Time, namespace string) (t Timings, err error) {
	if _, err := pool.Exec(ctx, `ANALYZE orders, steps, transitions`); err != nil {
		return t, fmt.Errorf("timings: analyze: %w", err)
	}
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		t, err = readTimings(ctx, tx, from, to, namespace)
		return err
	})
	return t, err
}

func readTimings(ctx context.Context, pool pgx.Tx, from, to time.Time, namespace string) (Timings, error) {
	t := Timings{Ended: map[string]int{}}
	names := []string{StageSubmitToRow, StageRowToClaim, StageClaimToAgent, StageRemoteCall, StageReplyToApplied, StageOrder}
	for _, n := range names {
		t.Stages = append(t.Stages, StageLatency{Stage: n})
	}
	// Of one namespace only when asked: a store from before namespaces
	// (an A/B's base) has no such column.
	inNamespace, args := "", []any{from, to}
	if namespace != "" {
		inNamespace, args = " AND namespace = $3", append(args, namespace)
	}
	rows, err := pool.Query(ctx, strings.Replace(timingsSQL, "/*namespace*/", inNamespace, 1), args...)
	if err != nil {
		return t, fmt.Errorf("timings: %w", err)
	}
	defer rows.Close()
	us := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
	for rows.Next() {
		var ord, n int
		var pcts []float64
		var maxUS, meanUS float64
		if err := rows.Scan(&ord, &n, &pcts, &maxUS, &meanUS); err != nil {
			return t, fmt.Errorf("timings: %w", err)
		}
		if ord < 1 || ord > len(names) || len(pcts) != 3 {
			return t, fmt.Errorf("timings: unexpected row %d", ord)
		}
		t.Stages[ord-1].Latency = Latency{N: n, P50: us(pcts[0]), P95: us(pcts[1]), P99: us(pcts[2]), Max: us(maxUS), Mean: us(meanUS)}
	}
	if err := rows.Err(); err != nil {
		return t, fmt.Errorf("timings: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT status, count(*) FROM orders WHERE placed_at >= $1 AND placed_at < $2`+inNamespace+` GROUP BY status`, args...)
	if err != nil {
		return t, fmt.Errorf("timings: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return t, fmt.Errorf("timings: %w", err)
		}
		t.Placed += n
		if ended(st) {
			t.Ended[st] = n
		}
	}
	if err := rows.Err(); err != nil {
		return t, fmt.Errorf("timings: %w", err)
	}
	err = pool.QueryRow(ctx, `
		SELECT count(*) FROM orders o JOIN transitions t ON t.order_id = o.order_id
		WHERE o.created_at >= $1::timestamptz - interval '10 minutes' AND o.created_at < $2
		  AND t.step IS NULL AND t.to_state = 'completed' AND t.at >= $1 AND t.at < $2`, from, to).Scan(&t.Completions)
	if err != nil {
		return t, fmt.Errorf("timings: completions: %w", err)
	}
	return t, nil
}

// ended reports whether status is one an order ends in.
func ended(status string) bool {
	return status == "completed" || status == "failed" || status == "error"
}
