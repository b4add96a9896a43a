package statestore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NewOrder is an order as the submitter writes it.
type NewOrder struct {
	OrderID  string
	Workflow string
	// WorkflowVersion is the version (content hash) of the workflow's
	// definition the order runs, stored by StoreWorkflowVersions first;
	// "" for none.
	WorkflowVersion string
	// Payload is the order's payload: a JSON object.
	Payload  []byte
	Priority int
	ReplyTo  string
	PlacedAt *time.Time
	// StartAt, when set and later than the insert (on the database
	// clock), holds the order's first steps delayed until then.
	StartAt *time.Time
	// PayloadHash identifies the payload: a resubmission of the same
	// order_id with the same hash is a duplicate, with another a conflict.
	PayloadHash []byte
	// FailurePolicy is PolicyCompensate or PolicyHold.
	FailurePolicy string
	// Steps in step order: the actions first (the first is created
	// pending, the others waiting), then the compensations (waiting), the
	// one undoing the last action first.
	Steps []NewStep
	// Actor is who wrote the order (e.g. "submitter:host-123"), recorded in
	// the history.
	Actor string
	// Traceparent is the W3C trace context every later span of the order
	// joins; "" when tracing is off.
	Traceparent string
	// CorrelationID is the submit's AMQP correlation_id, sent back with
	// the order's "received" event (migration 0022); "" for none.
	CorrelationID string
	// Attributes are the order's search attributes (its workflow's
	// search_attributes over its payload), written with it.
	Attributes []Attribute
	// Key, when its workflow declares a concurrency_key, is the order's:
	// its steps are served round robin with other keys' (limited_pick).
	Key *ConcurrencyKey
	// Deadline, when set, bounds the order as a whole from its start
	// (its submit, or StartAt when later), on the database clock: when it
	// passes the order follows OnDeadline (workflow.Compensate, Hold or
	// Fail; fire_deadlines).
	Deadline   time.Duration
	OnDeadline string
	// Namespace is the tenant the order belongs to; "" is
	// DefaultNamespace.
	Namespace string
}

// ConcurrencyKey is an order's key (its workflow's concurrency_key over
// its payload) and how many of its steps of one agent kind may be
// processing at once (0: no bound, only the round robin).
type ConcurrencyKey struct {
	Key       string
	MaxPerKey int
}

// Failure policies.
const (
	PolicyCompensate = "compensate" // a failed action starts the compensations
	PolicyHold       = "hold"       // a failed action holds the order in error for an operator
)

// Step kinds.
const (
	KindAction       = "action"
	KindCompensation = "compensation"
)

// NewStep is one step of a new order.
type NewStep struct {
	Name  string
	Agent string
	// Kind is KindAction (the default) or KindCompensation.
	Kind string
	// Compensates is, for a compensation, the step number of the action
	// it undoes.
	Compensates int
	// Timeout is the budget a claim gives the step (complete_by = now() +
	// Timeout on the database clock).
	Timeout time.Duration
	// MaxFailures is the failure threshold: the supervisor marks the step
	// error when failure_count reaches it.
	MaxFailures int
	// BackoffBase and BackoffMax, when set, replace the supervisor's
	// backoff for this step.
	BackoffBase, BackoffMax time.Duration
	// Needs, for a step of a graph (nil for a list's), are the step
	// numbers that must have ended before it runs (an action with none
	// is created pending); Ancestors the actions whose results its
	// request carries; Spec what the workflow says of it beyond a list's
	// keys (StepSpec, as JSON).
	Needs, Ancestors []int
	Spec             []byte
}

// InsertOutcome says what InsertOrder did.
type InsertOutcome int

const (
	// Inserted: the order, its steps and their history were written.
	Inserted InsertOutcome = iota + 1
	// Duplicate: the same order with the same payload was already there;
	// nothing changed.
	Duplicate
)

func (o InsertOutcome) String() string {
	switch o {
	case Inserted:
		return "inserted"
	case Duplicate:
		return "duplicate"
	}
	return "unknown"
}

// IdempotencyKey is a step's key, stable across all its attempts, that
// agents send to the remote service.
func IdempotencyKey(orderID string, step int, name string) string {
	return fmt.Sprintf("%s/%d/%s", orderID, step, name)
}

// DefaultNamespace is the namespace of every order and API token that
// names none (migration 0043: every one made before namespaces).
const DefaultNamespace = "default"

// insertOrdersSQL writes orders, their steps, the history of their
// creation and a "received" status event each in one statement, and so in
// one transaction; the statement's fixed costs (planning its parts,
// preparing every table's checks and triggers) are paid once per batch
// instead of once per order. ON CONFLICT DO NOTHING makes a resubmission
// write nothing; the caller then compares payload hashes. Orders come as parallel arrays ($1..$10, one element per order),
// steps as parallel arrays ($11..$21, one element per step, $11 the
// 1-based index of its order), then the orders' traceparents ($22) and
// correlation ids ($23), then the steps' needs and ancestors ($24, $25,
// as array literals, NULL for a list's steps) and specs ($26), then the
// orders' start_at ($27), and their concurrency keys and max_per_key
// ($28, $29), written on each of their steps that calls an agent (the
// steps sas performs itself are claimed as they are). A first step is delayed (due at start_at, plus
// its delay) when its order starts later or it has a delay; a first wait
// (step_settles) begins to wait at once, awaiting until its timeout. Order ids must be distinct. It returns the
// index of every order it wrote. A step created waiting gets no history
// row: its own row says as much, and its history begins when it leaves
// waiting (so a step's history with no creation row starts in waiting).
// That is one history row fewer for each step after the first and for
// every compensation, most of which never run.
const insertOrdersSQL = `
WITH o AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::int[],
                         $6::text[], $7::timestamptz[], $8::bytea[], $9::text[], $10::text[], $22::text[], $23::text[],
                         $27::timestamptz[], $28::text[], $29::int[]) WITH ORDINALITY
        AS o(order_id, workflow, workflow_version, payload, priority, reply_to, placed_at, payload_hash, failure_policy, actor,
             traceparent, correlation_id, start_at, fair_key, fair_max, idx)
), ins AS (
    INSERT INTO orders (order_id, workflow, workflow_version, payload, priority, reply_to, placed_at, payload_hash, failure_policy,
                        traceparent, start_at)
    SELECT order_id, workflow, NULLIF(workflow_version, ''), payload, priority, NULLIF(reply_to, ''), placed_at, payload_hash, failure_policy,
           NULLIF(traceparent, ''), start_at
    FROM o ORDER BY idx
    ON CONFLICT (order_id) DO NOTHING
    RETURNING order_id, reply_to
), insd AS (
    SELECT o.* FROM o JOIN ins ON ins.order_id = o.order_id
), st AS (
    INSERT INTO steps (order_id, step, name, kind, compensates, agent, process_state, priority, timeout, max_failures, idempotency_key,
                       backoff_base, backoff_max, needs, ancestors, spec, due_at, fair_key, fair_max)
    SELECT insd.order_id, s.step, s.name, s.kind, NULLIF(s.compensates, 0), s.agent,
           CASE WHEN s.needs IS NULL AND s.step = 1 OR s.needs = '{}' AND s.kind = 'action' THEN
                    CASE WHEN s.spec ? 'delay_ms' OR insd.start_at > clock_timestamp() THEN 'delayed'
                         WHEN step_settles(s.kind, s.agent, NULL, s.spec) = 'wait' THEN 'awaiting'
                         ELSE 'pending' END
                ELSE 'waiting' END,
           insd.priority, make_interval(secs => s.timeout_ms / 1000.0), s.max_failures, s.idempotency_key,
           make_interval(secs => NULLIF(s.backoff_base_ms, 0) / 1000.0), make_interval(secs => NULLIF(s.backoff_max_ms, 0) / 1000.0),
           s.needs::int[], s.ancestors::int[], s.spec,
           CASE WHEN (s.needs IS NULL AND s.step = 1 OR s.needs = '{}' AND s.kind = 'action')
                     AND (s.spec ? 'delay_ms' OR insd.start_at > clock_timestamp())
                THEN greatest(insd.start_at, clock_timestamp())
                     + make_interval(secs => coalesce((s.spec->>'delay_ms')::float8, 0) / 1000)
                WHEN (s.needs IS NULL AND s.step = 1 OR s.needs = '{}' AND s.kind = 'action')
                     AND step_settles(s.kind, s.agent, NULL, s.spec) = 'wait'
                THEN clock_timestamp() + make_interval(secs => (s.spec->'wait'->>'timeout_ms')::float8 / 1000) END,
           CASE WHEN s.agent <> '' THEN insd.fair_key END, CASE WHEN s.agent <> '' THEN insd.fair_max END
    FROM unnest($11::int[], $12::text[], $13::text[], $14::bigint[], $15::int[], $16::text[], $17::text[], $18::int[], $19::int[],
                $20::bigint[], $21::bigint[], $24::text[], $25::text[], $26::jsonb[])
             AS s(order_idx, name, agent, timeout_ms, max_failures, idempotency_key, kind, compensates, step, backoff_base_ms, backoff_max_ms,
                  needs, ancestors, spec)
    JOIN insd ON insd.idx = s.order_idx
    RETURNING order_id, step, process_state
), hist AS (
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    SELECT order_id, NULL, NULL, 'received', actor, 'submitted' FROM insd
    UNION ALL
    SELECT st.order_id, st.step, NULL, st.process_state, insd.actor, 'submitted' FROM st JOIN insd ON insd.order_id = st.order_id
    WHERE st.process_state <> 'waiting'
), ev AS (
    INSERT INTO outbox (message_type, order_id, reply_to, body, correlation_id)
    SELECT 'status_event', order_id, NULLIF(reply_to, ''), status_event_body(order_id, 'received', NULL), NULLIF(correlation_id, '')
    FROM insd
    WHERE coalesce(reply_to, '') <> '' OR (SELECT status_heard('received'))
), paused AS (
    -- An order of a paused workflow waits, paused with it (migration 0041).
    INSERT INTO order_pauses (order_id, paused_at, paused_by, reason, scope)
    SELECT insd.order_id, now(), w.paused_by, w.reason, 'workflow'
    FROM insd JOIN workflow_pauses w ON w.workflow = insd.workflow
)`

// insertOrdersEnd ends insertOrdersSQL: the index of every order written.
const insertOrdersEnd = `
SELECT idx::int FROM insd`

// insertAttributesSQL is the part of insertOrdersSQL, present only when a
// batch has search attributes, that writes them ($30..$35, one element
// per attribute, $30 the 1-based index of its order) with their order's
// created_at (the same now()), which the attribute indexes' keyset order
// needs.
const insertAttributesSQL = `, attr AS (
    INSERT INTO order_attributes (order_id, name, created_at, v_text, v_num, v_bool, v_time)
    SELECT insd.order_id, a.name, now(), a.v_text, a.v_num, a.v_bool, a.v_time
    FROM unnest($30::int[], $31::text[], $32::text[], $33::float8[], $34::bool[], $35::timestamptz[])
             AS a(order_idx, name, v_text, v_num, v_bool, v_time)
    JOIN insd ON insd.idx = a.order_idx
)`

// insertDeadlinesSQL is the part of insertOrdersSQL, present only when a
// batch has deadlines, that writes them (%[1]s..%[3]s, one element per
// deadline, the first the 1-based index of its order), each due its
// length after the order starts.
const insertDeadlinesSQL = `, dl AS (
    INSERT INTO order_deadlines (order_id, due_at, deadline_ms, on_deadline)
    SELECT insd.order_id, greatest(insd.start_at, now()) + make_interval(secs => d.ms / 1000.0), d.ms, d.how
    FROM unnest(%[1]s::int[], %[2]s::bigint[], %[3]s::text[]) AS d(order_idx, ms, how)
    JOIN insd ON insd.idx = d.order_idx
)`

// InsertOrder writes an order with its steps and their history in one
// transaction (insertOrdersSQL with one order). The same order id with the
// same payload hash is a Duplicate and writes nothing; with another hash it
// is ErrConflict.
func (s *Store) InsertOrder(ctx context.Context, o NewOrder) (InsertOutcome, error) {
	if len(o.Steps) == 0 {
		return 0, fmt.Errorf("insert order %s: no steps", o.OrderID)
	}
	written, err := s.insertOne(ctx, s.pool, o, false)
	if err != nil {
		return 0, err
	}
	if written {
		return Inserted, nil
	}
	return s.existing(ctx, o)
}

// insertOne runs insertOrdersSQL for o alone on q (the pool, or a
// transaction) and reports whether it wrote the order (false: its id
// was taken).
// In a partition's store (Store.FenceAs) it writes o only if the
// partition owns its bucket (else ElsewhereError or ErrMoving).
func (s *Store) insertOne(ctx context.Context, q execQuerier, o NewOrder, admitted bool) (bool, error) {
	a := insertArrays{admitted: admitted}
	s.add(&a, o, 1)
	idxs, err := runInsert(ctx, q, &a)
	if err != nil {
		return false, fmt.Errorf("insert order %s: %w", o.OrderID, classify(err))
	}
	if len(idxs) == 1 && idxs[0] < 0 {
		return false, s.elsewhere(ctx, o.OrderID, a.buckets[0])
	}
	return len(idxs) == 1, nil
}

// execQuerier is the pool or a transaction.
type execQuerier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// add appends o to a as its idx-th order, with its bucket in a
// partition's store.
func (s *Store) add(a *insertArrays, o NewOrder, idx int) {
	a.add(o, idx)
	if s.fence != nil {
		a.buckets = append(a.buckets, int32(s.fence.bucketOf(o.OrderID)))
		a.partition = s.fence.name
	}
}

// runInsert runs a's statement on q and returns the indexes it reports
// (insertOrdersEnd, insertFencedEnd). In a partition's store the fence
// lock is taken shared first, in a statement of the same
// transaction: on the pool, both go in one round trip (a pipeline is one
// implicit transaction).
func runInsert(ctx context.Context, q execQuerier, a *insertArrays) ([]int, error) {
	if a.buckets == nil {
		rows, err := q.Query(ctx, a.sql(), a.args()...)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[int])
	}
	pool, isPool := q.(*pgxpool.Pool)
	if !isPool {
		if _, err := q.Exec(ctx, lockBucketsSQL); err != nil {
			return nil, err
		}
		rows, err := q.Query(ctx, a.sql(), a.args()...)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[int])
	}
	b := &pgx.Batch{}
	b.Queue(lockBucketsSQL)
	b.Queue(a.sql(), a.args()...)
	br := pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	var idxs []int
	if err == nil {
		idxs, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return idxs, err
}

// InsertOrders writes many orders in one statement, each as InsertOrder
// would; outcomes and errors are by index. If the statement fails as a
// whole (one order's data refused, a database error), every order is
// written again on its own, so one bad order never holds up the others.
func (s *Store) InsertOrders(ctx context.Context, orders []NewOrder) ([]InsertOutcome, []error) {
	outcomes := make([]InsertOutcome, len(orders))
	errs := make([]error, len(orders))
	var a insertArrays
	seen := make(map[string]bool, len(orders))
	var sent []int // indexes of the orders in the statement
	for i, o := range orders {
		if len(o.Steps) == 0 {
			errs[i] = fmt.Errorf("insert order %s: no steps", o.OrderID)
			continue
		}
		if seen[o.OrderID] {
			continue // a repeat within the batch: settled after the write
		}
		seen[o.OrderID] = true
		sent = append(sent, i)
		s.add(&a, o, len(sent))
	}
	written := make(map[int]bool, len(sent))
	if len(sent) > 0 {
		idxs, err := runInsert(ctx, s.pool, &a)
		if err == nil {
			for _, idx := range idxs {
				if idx < 0 {
					errs[sent[-idx-1]] = s.elsewhere(ctx, orders[sent[-idx-1]].OrderID, a.buckets[-idx-1])
					continue
				}
				written[sent[idx-1]] = true
			}
		}
		if err != nil {
			for i, o := range orders {
				if errs[i] == nil {
					outcomes[i], errs[i] = s.InsertOrder(ctx, o)
				}
			}
			return outcomes, errs
		}
	}
	for i, o := range orders {
		switch {
		case errs[i] != nil:
		case written[i]:
			outcomes[i] = Inserted
		default:
			outcomes[i], errs[i] = s.existing(ctx, o)
		}
	}
	return outcomes, errs
}

// insertArrays are insertOrdersSQL's parallel arrays.
type insertArrays struct {
	ids, workflows, versions, replyTos, policies, actors []string
	traceparents, correlations                           []string
	payloads                                             []string // JSON
	priorities                                           []int32
	placedAt, startAt                                    []*time.Time
	hashes                                               [][]byte
	fairKeys                                             []*string
	fairMax                                              []*int32

	stepOrder, stepNo, maxFailures, compensates []int32
	names, agents, keys, kinds                  []string
	timeouts, backoffBases, backoffMaxes        []int64
	needs, ancestors, specs                     []*string

	attrOrder []int32
	attrNames []string
	attrText  []*string
	attrNum   []*float64
	attrBool  []*bool
	attrTime  []*time.Time

	deadlineOrder []int32
	deadlineMs    []int64
	deadlineHow   []string

	// namespaces has every order's namespace once any is not the
	// default; nil while all are.
	namespaces []string
	// admitted: the statement's order is admitted after it
	// (namespace_admit), which counts it.
	admitted bool

	// buckets are the orders' buckets and partition the store's name,
	// in a partition's store (Store.FenceAs); nil otherwise.
	buckets   []int32
	partition string
}

// unboundSQL is the part of a statement writing orders of namespaces
// other than the default (%[1]s their names) that were not admitted
// (namespace_admit): the bound of each one's orders in flight no longer
// holds, and its next admission counts them.
const unboundSQL = `, unbound AS (
    UPDATE namespaces n SET in_flight_bound = NULL
    WHERE n.in_flight_bound IS NOT NULL AND n.name = ANY(%[1]s::text[]) AND EXISTS (SELECT 1 FROM insd)
)`

// add appends o as the idx-th (1-based) order of the statement.
func (a *insertArrays) add(o NewOrder, idx int) {
	a.ids = append(a.ids, o.OrderID)
	a.workflows = append(a.workflows, o.Workflow)
	a.versions = append(a.versions, o.WorkflowVersion)
	a.payloads = append(a.payloads, string(o.Payload))
	a.priorities = append(a.priorities, int32(o.Priority))
	a.replyTos = append(a.replyTos, o.ReplyTo)
	a.placedAt = append(a.placedAt, o.PlacedAt)
	a.startAt = append(a.startAt, o.StartAt)
	a.hashes = append(a.hashes, o.PayloadHash)
	a.policies = append(a.policies, cmp.Or(o.FailurePolicy, PolicyCompensate))
	a.actors = append(a.actors, o.Actor)
	a.traceparents = append(a.traceparents, o.Traceparent)
	a.correlations = append(a.correlations, o.CorrelationID)
	var key *string
	var perKey *int32
	if o.Key != nil {
		key = &o.Key.Key
		if o.Key.MaxPerKey > 0 {
			n := int32(o.Key.MaxPerKey)
			perKey = &n
		}
	}
	a.fairKeys, a.fairMax = append(a.fairKeys, key), append(a.fairMax, perKey)
	if ns := cmp.Or(o.Namespace, DefaultNamespace); ns != DefaultNamespace || a.namespaces != nil {
		for len(a.namespaces) < idx-1 {
			a.namespaces = append(a.namespaces, DefaultNamespace)
		}
		a.namespaces = append(a.namespaces, ns)
	}
	if o.Deadline > 0 {
		a.deadlineOrder = append(a.deadlineOrder, int32(idx))
		a.deadlineMs = append(a.deadlineMs, max(o.Deadline.Milliseconds(), 1))
		a.deadlineHow = append(a.deadlineHow, cmp.Or(o.OnDeadline, PolicyCompensate))
	}
	for _, at := range o.Attributes {
		a.attrOrder = append(a.attrOrder, int32(idx))
		a.attrNames = append(a.attrNames, at.Name)
		a.attrText = append(a.attrText, at.Text)
		a.attrNum = append(a.attrNum, at.Num)
		a.attrBool = append(a.attrBool, at.Bool)
		a.attrTime = append(a.attrTime, at.Time)
	}
	for i, st := range o.Steps {
		a.stepOrder = append(a.stepOrder, int32(idx))
		a.names = append(a.names, st.Name)
		a.agents = append(a.agents, st.Agent)
		a.timeouts = append(a.timeouts, st.Timeout.Milliseconds())
		a.maxFailures = append(a.maxFailures, int32(st.MaxFailures))
		a.keys = append(a.keys, IdempotencyKey(o.OrderID, i+1, st.Name))
		a.kinds = append(a.kinds, cmp.Or(st.Kind, KindAction))
		a.compensates = append(a.compensates, int32(st.Compensates))
		a.stepNo = append(a.stepNo, int32(i+1))
		a.backoffBases = append(a.backoffBases, st.BackoffBase.Milliseconds())
		a.backoffMaxes = append(a.backoffMaxes, st.BackoffMax.Milliseconds())
		a.needs = append(a.needs, intArray(st.Needs))
		a.ancestors = append(a.ancestors, intArray(st.Ancestors))
		var spec *string
		if st.Spec != nil {
			v := string(st.Spec)
			spec = &v
		}
		a.specs = append(a.specs, spec)
	}
}

// intArray writes ns as a Postgres array literal; nil stays NULL.
func intArray(ns []int) *string {
	if ns == nil {
		return nil
	}
	b := []byte{'{'}
	for i, n := range ns {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	v := string(append(b, '}'))
	return &v
}

// sql is insertOrdersSQL, with insertAttributesSQL when any order of the
// batch has search attributes and insertDeadlinesSQL when any has a
// deadline: orders without any pay nothing for them.
func (a *insertArrays) sql() string {
	if len(a.attrOrder) == 0 && len(a.deadlineOrder) == 0 && a.namespaces == nil && a.buckets == nil {
		return insertOrdersSQL + insertOrdersEnd
	}
	q := insertOrdersSQL
	end := insertOrdersEnd
	next := 30
	if len(a.attrOrder) > 0 {
		q += insertAttributesSQL
		next += 6
	}
	if len(a.deadlineOrder) > 0 {
		q += fmt.Sprintf(insertDeadlinesSQL, "$"+strconv.Itoa(next), "$"+strconv.Itoa(next+1), "$"+strconv.Itoa(next+2))
		next += 3
	}
	if a.namespaces != nil {
		q = withNamespaces(q, "$"+strconv.Itoa(next))
		if !a.admitted {
			q += fmt.Sprintf(unboundSQL, "$"+strconv.Itoa(next))
		}
		next++
	}
	if a.buckets != nil {
		q = strings.Replace(q, "WITH o AS (", "WITH o_all AS (", 1)
		q = strings.Replace(q, "\n), ins AS (", fmt.Sprintf(fencedSQL, "$"+strconv.Itoa(next), "$"+strconv.Itoa(next+1))+"\n), ins AS (", 1)
		end = insertFencedEnd
	}
	return q + end
}

// fencedSQL is the part of insertOrdersSQL, in a partition's store
// (Store.FenceAs), that keeps out of the write every order whose bucket
// (%[1]s, one element per order) this partition (%[2]s) does not own as
// partition_buckets says (moved away, or moving here and not yet
// accepted) and every order whose id a bucket's earlier owner wrote
// (moved_orders: a retry across a move, settled as a duplicate or a
// conflict by existing). The statement before it in the same
// transaction took the fence lock shared (lockBucketsSQL), which a move
// takes alone as it fences a bucket: this statement's snapshot, taken
// after, sees the move.
const fencedSQL = `
), away AS (
    SELECT b.idx FROM unnest(%[1]s::int[]) WITH ORDINALITY AS b(bucket, idx)
    JOIN partition_buckets pb ON pb.bucket = b.bucket
    WHERE pb.owner <> %[2]s OR pb.state = 'moving'
), o AS (
    SELECT * FROM o_all
    WHERE idx NOT IN (SELECT idx FROM away)
      AND NOT EXISTS (SELECT 1 FROM moved_orders m WHERE m.order_id = o_all.order_id)`

// insertFencedEnd ends a fenced insertOrdersSQL: the index of every
// order written, and the negated index of every order its partition does
// not own now.
const insertFencedEnd = `
SELECT idx::int FROM insd UNION ALL SELECT -idx::int FROM away`

// lockBucketsSQL takes the partition's fence lock shared until the
// transaction ends: a move fencing a bucket (FenceBucket) takes it alone,
// so it waits for the writes in flight, and writes after it see the
// bucket moved. One lock for every bucket keeps a write's cost the same
// whatever buckets its batch holds; a fence holds it for one upsert.
const lockBucketsSQL = `SELECT pg_advisory_xact_lock_shared(` + fenceLockKey + `)`

// fenceLockKey is a partition's fence lock, one per schema.
const fenceLockKey = `hashtextextended('sas.fence.' || current_schema(), 0)`

// withNamespaces is insertOrdersSQL writing each order's namespace, the
// element of the text array p at the order's place (orders of the
// default namespace write none: the column's default), on the order and
// on its steps, whose fair_key it then holds (step_fair_key: a
// namespace's key is never another's, and a kind it has limits on is
// claimed by it).
func withNamespaces(q, p string) string {
	q = strings.Replace(q, "traceparent, start_at)\n", "traceparent, start_at, namespace)\n", 1)
	q = strings.Replace(q, "NULLIF(traceparent, ''), start_at\n", "NULLIF(traceparent, ''), start_at, ("+p+"::text[])[idx]\n", 1)
	q = strings.Replace(q, "due_at, fair_key, fair_max)\n", "due_at, fair_key, fair_max, namespace)\n", 1)
	ns := "(" + p + "::text[])[insd.idx]"
	return strings.Replace(q, "CASE WHEN s.agent <> '' THEN insd.fair_key END, CASE WHEN s.agent <> '' THEN insd.fair_max END\n",
		"step_fair_key("+ns+", s.agent, insd.fair_key), CASE WHEN s.agent <> '' THEN insd.fair_max END, NULLIF("+ns+", 'default')\n", 1)
}

func (a *insertArrays) args() []any {
	args := []any{a.ids, a.workflows, a.versions, a.payloads, a.priorities, a.replyTos, a.placedAt,
		a.hashes, a.policies, a.actors,
		a.stepOrder, a.names, a.agents, a.timeouts, a.maxFailures, a.keys, a.kinds, a.compensates, a.stepNo,
		a.backoffBases, a.backoffMaxes, a.traceparents, a.correlations, a.needs, a.ancestors, a.specs, a.startAt}
	args = append(args, a.fairKeys, a.fairMax)
	if len(a.attrOrder) > 0 {
		args = append(args, a.attrOrder, a.attrNames, a.attrText, a.attrNum, a.attrBool, a.attrTime)
	}
	if len(a.deadlineOrder) > 0 {
		args = append(args, a.deadlineOrder, a.deadlineMs, a.deadlineHow)
	}
	if a.namespaces != nil {
		for len(a.namespaces) < len(a.ids) {
			a.namespaces = append(a.namespaces, DefaultNamespace)
		}
		args = append(args, a.namespaces)
	}
	if a.buckets != nil {
		args = append(args, a.buckets, a.partition)
	}
	return args
}

// existing tells a duplicate from a conflict for an order whose insert
// wrote nothing.
func (s *Store) existing(ctx context.Context, o NewOrder) (InsertOutcome, error) {
	// The statement's snapshot may predate a concurrent insert of the same
	// id that it waited for, so read the existing row in a new statement.
	var hash []byte
	q := `SELECT payload_hash FROM orders WHERE order_id = $1`
	if s.fence != nil {
		// Or written by an earlier owner of its bucket.
		q += ` UNION ALL SELECT payload_hash FROM moved_orders WHERE order_id = $1 LIMIT 1`
	}
	err := s.pool.QueryRow(ctx, q, o.OrderID).Scan(&hash)
	if errors.Is(err, pgx.ErrNoRows) {
		// Deleted between the two statements (retention): nothing of ours
		// was written, so let the caller retry.
		return 0, fmt.Errorf("insert order %s: existing row vanished, retry", o.OrderID)
	}
	if err != nil {
		return 0, fmt.Errorf("read existing order %s: %w", o.OrderID, err)
	}
	if !bytes.Equal(hash, o.PayloadHash) {
		return 0, fmt.Errorf("insert order %s: %w", o.OrderID, ErrConflict)
	}
	return Duplicate, nil
}

// WorkflowVersion is one version of a workflow's definition.
type WorkflowVersion struct {
	Name    string
	Version string
	// Definition is the workflow as JSON (workflow.Workflow.Definition).
	Definition []byte
	CreatedBy  string
	CreatedAt  time.Time
	// Active is how many orders of this version have not ended.
	Active int64
}

// StoreWorkflowVersions records the definitions orders may name; a
// version already stored is left as it is (the same name and version is
// the same definition).
func (s *Store) StoreWorkflowVersions(ctx context.Context, vs []WorkflowVersion) error {
	names, versions, defs, bys := make([]string, len(vs)), make([]string, len(vs)), make([]string, len(vs)), make([]string, len(vs))
	for i, v := range vs {
		names[i], versions[i], defs[i], bys[i] = v.Name, v.Version, string(v.Definition), v.CreatedBy
	}
	_, err := s.pool.Exec(ctx, `
INSERT INTO workflow_versions (name, version, definition, created_by)
SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::text[])
ON CONFLICT (name, version) DO NOTHING`, names, versions, defs, bys)
	if err != nil {
		return fmt.Errorf("store workflow versions: %w", classify(err))
	}
	return nil
}

// WorkflowVersions lists every stored version, newest first per name, with
// how many orders of each have not ended.
func (s *Store) WorkflowVersions(ctx context.Context) ([]WorkflowVersion, error) {
	rows, err := s.pool.Query(ctx, `
SELECT v.name, v.version, v.definition, v.created_by, v.created_at, coalesce(a.n, 0)
FROM workflow_versions v
LEFT JOIN (SELECT workflow, workflow_version, count(*) AS n FROM orders
           WHERE status IN ('received', 'processing', 'compensating') GROUP BY 1, 2) a
       ON a.workflow = v.name AND a.workflow_version = v.version
ORDER BY v.name, v.created_at DESC`)
	if err != nil {
		return nil, fmt.Errorf("workflow versions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (WorkflowVersion, error) {
		var v WorkflowVersion
		err := row.Scan(&v.Name, &v.Version, &v.Definition, &v.CreatedBy, &v.CreatedAt, &v.Active)
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("workflow versions: %w", err)
	}
	return out, nil
}
