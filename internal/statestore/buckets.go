package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A partition's store (docs/SCALING.md): orders are spread over several
// stores by their id's bucket, and a bucket may move from one partition
// to another while orders flow. partition_buckets, in every partition's
// store, names the owner of each bucket moved since the layout file split
// them; every write of a submitted order checks it under the bucket's
// lock, which a move takes alone to fence the bucket.

// fence makes a store a partition's: name is its partition, bucketOf an
// order id's bucket.
type fence struct {
	name     string
	bucketOf func(orderID string) int
}

// FenceAs makes s partition name's store: every submitted order it
// writes (InsertOrder, InsertOrders, InsertOrderWithinQuota) is written
// only while the partition owns the order's bucket (bucketOf), as
// partition_buckets says under the fence lock, and never when an
// earlier owner of its bucket wrote its id. Call it before the store is
// used.
func (s *Store) FenceAs(name string, bucketOf func(orderID string) int) {
	s.fence = &fence{name: name, bucketOf: bucketOf}
}

// ErrMoving: the order's bucket is moving into this partition, which
// writes its orders once the move has copied the ids its earlier owner
// wrote. Retry shortly.
var ErrMoving = errors.New("its bucket is moving to this partition: retry shortly")

// ElsewhereError: the order's bucket belongs to another partition now.
type ElsewhereError struct {
	OrderID, Owner string
}

func (e *ElsewhereError) Error() string {
	return fmt.Sprintf("order %s: its bucket is partition %s's now", e.OrderID, e.Owner)
}

// elsewhere says why an order of bucket b was not written.
func (s *Store) elsewhere(ctx context.Context, orderID string, b int32) error {
	var owner, state string
	err := s.pool.QueryRow(ctx, `SELECT owner, state FROM partition_buckets WHERE bucket = $1`, b).Scan(&owner, &state)
	switch {
	case err != nil:
		return fmt.Errorf("read bucket %d's owner: %w", b, err)
	case owner == s.fence.name:
		return ErrMoving
	}
	return &ElsewhereError{OrderID: orderID, Owner: owner}
}

// BucketOwner is a moved bucket's owner now.
type BucketOwner struct {
	Bucket    int
	Owner     string
	Moving    bool
	UpdatedAt time.Time
}

// BucketOwners is every moved bucket's owner, by bucket.
func (s *Store) BucketOwners(ctx context.Context) (map[int]BucketOwner, error) {
	list, err := queryAll(ctx, s, "bucket owners", pgx.RowToStructByPos[BucketOwner],
		`SELECT bucket, owner, state = 'moving', updated_at FROM partition_buckets`)
	if err != nil {
		return nil, err
	}
	out := make(map[int]BucketOwner, len(list))
	for _, b := range list {
		out[b.Bucket] = b
	}
	return out, nil
}

// SetBucketOwner records bucket's owner (moving: holding its submits
// until the move is done).
func (s *Store) SetBucketOwner(ctx context.Context, bucket int, owner string, moving bool) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO partition_buckets (bucket, owner, state) VALUES ($1, $2, $3)
		ON CONFLICT (bucket) DO UPDATE SET owner = excluded.owner, state = excluded.state, updated_at = clock_timestamp()`,
		bucket, owner, map[bool]string{true: "moving", false: "moved"}[moving])
	if err != nil {
		return fmt.Errorf("set bucket %d's owner: %w", bucket, classify(err))
	}
	return nil
}

// FenceBucket records, in the store of the partition a bucket leaves,
// that owner has it now (moving), once every write of orders in flight
// has ended: it takes the fence lock alone, which each write takes
// shared (holding the partition's writes for the one upsert), so no
// order of the bucket is written here after it returns.
func (s *Store) FenceBucket(ctx context.Context, bucket int, owner string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("fence bucket %d: %w", bucket, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+fenceLockKey+`)`); err != nil {
		return fmt.Errorf("fence bucket %d: %w", bucket, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO partition_buckets (bucket, owner, state) VALUES ($1, $2, 'moving')
		ON CONFLICT (bucket) DO UPDATE SET owner = excluded.owner, state = 'moving', updated_at = clock_timestamp()`, bucket, owner); err != nil {
		return fmt.Errorf("fence bucket %d: %w", bucket, classify(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("fence bucket %d: %w", bucket, err)
	}
	return nil
}

// OrderID is an order's id, payload hash and whether it has ended.
type OrderID struct {
	OrderID     string
	PayloadHash []byte
	Ended       bool
}

// OrderIDs is a page of the store's orders by id, after after ("" from
// the first), at most limit.
func (s *Store) OrderIDs(ctx context.Context, after string, limit int) ([]OrderID, error) {
	q := `SELECT order_id::text, payload_hash, status IN ('completed', 'failed')
		FROM orders WHERE ($1 = '' OR order_id > $1::uuid) ORDER BY order_id LIMIT $2`
	return queryAll(ctx, s, "order ids", pgx.RowToStructByPos[OrderID], q, after, limit)
}

// RunningOrderIDs is a page of the ids of the store's orders that have
// not ended, after after ("" from the first), at most limit.
func (s *Store) RunningOrderIDs(ctx context.Context, after string, limit int) ([]string, error) {
	return queryAll(ctx, s, "running order ids", pgx.RowTo[string], `SELECT order_id::text FROM orders
		WHERE status NOT IN ('completed', 'failed') AND ($1 = '' OR order_id > $1::uuid) ORDER BY order_id LIMIT $2`, after, limit)
}

// MovedOrderIDs is a page of the ids earlier owners of buckets wrote
// and this store holds in moved_orders, after after ("" from the
// first), at most limit: a bucket moved on again takes them along.
func (s *Store) MovedOrderIDs(ctx context.Context, after string, limit int) ([]OrderID, error) {
	return queryAll(ctx, s, "moved order ids", pgx.RowToStructByPos[OrderID], `SELECT order_id::text, payload_hash, true FROM moved_orders
		WHERE ($1 = '' OR order_id > $1::uuid) ORDER BY order_id LIMIT $2`, after, limit)
}

// CopyMovedOrders records ids an earlier owner of their bucket (from)
// wrote, so that this store never writes them again.
func (s *Store) CopyMovedOrders(ctx context.Context, from string, ids []OrderID) error {
	if len(ids) == 0 {
		return nil
	}
	keys, hashes := make([]string, len(ids)), make([][]byte, len(ids))
	for i, o := range ids {
		keys[i], hashes[i] = o.OrderID, o.PayloadHash
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO moved_orders (order_id, payload_hash, from_partition)
		SELECT * FROM unnest($1::uuid[], $2::bytea[], array_fill($3::text, ARRAY[cardinality($1::uuid[])]))
		ON CONFLICT (order_id) DO NOTHING`, keys, hashes, from)
	if err != nil {
		return fmt.Errorf("copy moved order ids: %w", classify(err))
	}
	return nil
}

// BucketMove is one move of a bucket and how far it got.
type BucketMove struct {
	ID        int64
	Bucket    int
	From, To  string
	State     string // copying, draining, done
	Copied    int64  // ids copied to the new owner
	Running   int64  // the bucket's orders still running in the old owner
	StartedAt time.Time
	UpdatedAt time.Time
	EndedAt   *time.Time
	StartedBy string
}

const bucketMoveColumns = `id, bucket, from_partition, to_partition, state, copied, running, started_at, updated_at, ended_at, started_by`

// OpenMove is bucket's move still copying, if any.
func (s *Store) OpenMove(ctx context.Context, bucket int) (BucketMove, bool, error) {
	open, err := queryAll(ctx, s, "moves", pgx.RowToStructByPos[BucketMove],
		`SELECT `+bucketMoveColumns+` FROM partition_moves WHERE bucket = $1 AND state = 'copying'`, bucket)
	if err != nil || len(open) == 0 {
		return BucketMove{}, false, err
	}
	return open[0], true, nil
}

// StartMove records a move of bucket from one partition to another. A
// bucket moves once at a time: while another move of it is copying, it
// is refused (ErrInvalidState).
func (s *Store) StartMove(ctx context.Context, bucket int, from, to, by string) (BucketMove, error) {
	rows, err := s.pool.Query(ctx, `INSERT INTO partition_moves (bucket, from_partition, to_partition, state, started_by)
		VALUES ($1, $2, $3, 'copying', $4) ON CONFLICT (bucket) WHERE state = 'copying' DO NOTHING RETURNING `+bucketMoveColumns, bucket, from, to, by)
	if err != nil {
		return BucketMove{}, fmt.Errorf("record move: %w", classify(err))
	}
	m, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[BucketMove])
	if errors.Is(err, pgx.ErrNoRows) {
		return BucketMove{}, fmt.Errorf("bucket %d is moving already: %w", bucket, ErrInvalidState)
	}
	if err != nil {
		return BucketMove{}, fmt.Errorf("record move: %w", classify(err))
	}
	return m, nil
}

// UpdateMove records how far move id got.
func (s *Store) UpdateMove(ctx context.Context, id int64, state string, copied, running int64) error {
	_, err := s.pool.Exec(ctx, `UPDATE partition_moves SET state = $2, copied = $3, running = $4, updated_at = clock_timestamp(),
		ended_at = CASE WHEN $2 = 'done' THEN clock_timestamp() END WHERE id = $1`, id, state, copied, running)
	if err != nil {
		return fmt.Errorf("record move %d: %w", id, classify(err))
	}
	return nil
}

// DrainingMoves is every move draining: its new owner writes the
// bucket's orders, and its old owner's are not all ended yet.
func (s *Store) DrainingMoves(ctx context.Context) ([]BucketMove, error) {
	return queryAll(ctx, s, "moves", pgx.RowToStructByPos[BucketMove],
		`SELECT `+bucketMoveColumns+` FROM partition_moves WHERE state = 'draining' ORDER BY id`)
}

// Moves is every move, newest first, at most limit.
func (s *Store) Moves(ctx context.Context, limit int) ([]BucketMove, error) {
	return queryAll(ctx, s, "moves", pgx.RowToStructByPos[BucketMove],
		`SELECT `+bucketMoveColumns+` FROM partition_moves ORDER BY id DESC LIMIT $1`, limit)
}

// queryAll runs q and collects its rows with scan, naming what it read
// in an error.
func queryAll[T any](ctx context.Context, s *Store, what string, scan pgx.RowToFunc[T], q string, args ...any) ([]T, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return out, nil
}

// HasOrder reports whether order id is in this store.
func (s *Store) HasOrder(ctx context.Context, orderID string) (bool, error) {
	var found bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE order_id = $1)`, orderID).Scan(&found); err != nil {
		return false, fmt.Errorf("find order %s: %w", orderID, classify(err))
	}
	return found, nil
}
