package api

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sync/errgroup"

	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/partition"
	"sas/internal/statestore"
)

// part is one partition of the deployment as the API serves it (in a
// deployment of one state store, that store alone, named ""): its state
// store, its queues' prefix, the hub of its status events and the
// batcher of the submits written there. An order's routes go to the
// partition owning its id's bucket; lists merge every partition's.
type part struct {
	name    string
	store   *statestore.Store
	topo    broker.Topology
	hub     *hub
	inserts *batch.Batcher[statestore.NewOrder, statestore.InsertOutcome]
}

// partOf is the partition holding order id.
func (s *server) partOf(id string) *part {
	if s.layout == nil {
		return s.parts[0]
	}
	return s.parts[s.layout.Owner(partition.BucketOf(id, s.layout.Buckets))]
}

// inPartition names the partition in an error of a partitioned
// deployment.
func (p *part) inPartition(err error) error {
	if err == nil || p.name == "" {
		return err
	}
	return fmt.Errorf("partition %s: %w", p.name, err)
}

// everyPart runs f on every partition at once and joins their errors,
// each naming its partition.
func (s *server) everyPart(ctx context.Context, f func(ctx context.Context, i int, p *part) error) error {
	g, ctx := errgroup.WithContext(ctx)
	errs := make([]error, len(s.parts))
	for i, p := range s.parts {
		g.Go(func() error {
			errs[i] = p.inPartition(f(ctx, i, p))
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// orderPage is a page of the merged list of orders: each partition's page
// after the same cursor, merged newest first ((created_at, order_id)
// descending, the order of every list of orders), cut to the limit. No
// partition is read past limit+1 rows, and the next cursor is the last
// row's, so a page never skips nor repeats an order of any partition.
func (s *server) orderPage(ctx context.Context, q statestore.OrderQuery) ([]statestore.OrderRow, *statestore.OrderCursor, error) {
	if len(s.parts) == 1 {
		return s.parts[0].store.OrderPage(ctx, q)
	}
	pages := make([][]statestore.OrderRow, len(s.parts))
	more := make([]bool, len(s.parts))
	err := s.everyPart(ctx, func(ctx context.Context, i int, p *part) error {
		rows, next, err := p.store.OrderPage(ctx, q)
		for j := range rows {
			rows[j].Partition = p.name
		}
		pages[i], more[i] = rows, next != nil
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	rows, next := statestore.MergeOrderPages(pages, slices.Contains(more, true), q.Limit)
	return rows, next, nil
}
