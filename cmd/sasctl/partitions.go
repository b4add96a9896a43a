package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/service"
	"sas/internal/statestore"
)

// partitionsFlag adds --file, the partitions layout (default:
// SAS_PARTITIONS_FILE).
func (a *app) partitionsFlag(fs *flag.FlagSet) func() (partition.Layout, error) {
	file := fs.String("file", os.Getenv("SAS_PARTITIONS_FILE"), "the partitions layout (default: SAS_PARTITIONS_FILE)")
	return func() (partition.Layout, error) {
		if *file == "" {
			return partition.Layout{}, a.usageError(fs, "give the partitions layout: --file FILE or SAS_PARTITIONS_FILE")
		}
		return partition.Load(*file)
	}
}

// runs writes buckets as runs: 0-85, 90.
func runs(buckets []int) string {
	var parts []string
	for i := 0; i < len(buckets); {
		j := i
		for j+1 < len(buckets) && buckets[j+1] == buckets[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprint(buckets[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", buckets[i], buckets[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// partitionRow is one partition as partitions show prints it.
type partitionRow struct {
	partition.Partition
	Buckets []int `json:"buckets"`
}

// partitionsShow prints the layout: each partition, its queue prefix,
// the variable holding its database URL and the buckets it owns (as
// moved since the file split them, when the first partition's store is
// reachable).
func (a *app) partitionsShow(ctx context.Context, args []string) error {
	fs := a.flags()
	load := a.partitionsFlag(fs)
	asJSON := fs.Bool("json", false, "print the layout as JSON")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	l, err := load()
	if err != nil {
		return err
	}
	followed, err := a.followMoves(ctx, &l)
	if err != nil {
		return err
	}
	rows := make([]partitionRow, len(l.Partitions))
	for i, p := range l.Partitions {
		rows[i] = partitionRow{p, l.Owned(i)}
	}
	if *asJSON {
		return a.printJSON(map[string]any{"exchange": l.Exchange, "buckets": l.Buckets, "partitions": rows, "moves_followed": followed})
	}
	fmt.Fprintf(a.stdout, "routing exchange %s, %d buckets\n", l.Exchange, l.Buckets)
	if !followed {
		fmt.Fprintf(a.stdout, "as the file splits them (set %s to see the buckets moved since)\n", l.Partitions[0].DatabaseURLEnv)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tQUEUE PREFIX\tDATABASE URL IN\tBUCKETS\tOWNED")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", r.Name, r.QueuePrefix, r.DatabaseURLEnv, len(r.Buckets), runs(r.Buckets))
	}
	return tw.Flush()
}

// partitionsSetup declares the layout on the broker: the routing
// exchange, a bucket exchange per bucket, each bound to its partition's
// submit entrance.
func (a *app) partitionsSetup(ctx context.Context, args []string) error {
	fs := a.flags()
	load := a.partitionsFlag(fs)
	renumber := fs.Bool("renumber", false, "bind every bucket to the routing exchange again in bucket order: after a broker node restarted, which numbers them in an order of its own")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	l, err := load()
	if err != nil {
		return err
	}
	// Buckets moved since the file split them are bound to their owner
	// now; the file alone would send them back to their first owner,
	// which passes their submits on.
	followed, err := a.followMoves(ctx, &l)
	if err != nil {
		return err
	}
	if !followed {
		fmt.Fprintf(a.stdout, "binding the buckets as the file splits them (set %s to bind those moved since to their owner)\n", l.Partitions[0].DatabaseURLEnv)
	}
	ch, closeChannel, err := a.brokerChannel(ctx)
	if err != nil {
		return err
	}
	defer closeChannel()
	if err := l.Declare(ch); err != nil {
		return err
	}
	if *renumber {
		if err := l.Renumber(ch); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "renumbered the %d buckets of %s\n", l.Buckets, l.Exchange)
	}
	fmt.Fprintf(a.stdout, "declared exchange %s (x-consistent-hash) with %d buckets:\n", l.Exchange, l.Buckets)
	for i, p := range l.Partitions {
		owned := l.Owned(i)
		fmt.Fprintf(a.stdout, "  %s: %d buckets (%s) to %s\n", p.Name, len(owned), runs(owned), p.SubmitEntrance())
	}
	return nil
}

// brokerChannel opens a channel on the broker, for declaring and
// binding exchanges, and the function that closes it and its connection.
func (a *app) brokerChannel(ctx context.Context) (*amqp.Channel, func(), error) {
	conn, pub, _, err := a.openBroker(ctx)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel(ctx)
	if err != nil {
		pub.Close()
		conn.Close()
		return nil, nil, fmt.Errorf("broker: %w", err)
	}
	return ch, func() {
		ch.Close()
		pub.Close()
		conn.Close()
	}, nil
}

// partitionsOf says which bucket and partition each order id belongs to.
func (a *app) partitionsOf(_ context.Context, args []string) error {
	fs := a.flags()
	load := a.partitionsFlag(fs)
	ids, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return a.usageError(fs, "give one order id or more")
	}
	l, err := load()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tBUCKET\tPARTITION")
	for _, raw := range ids {
		id, ok := messages.CanonicalID(raw)
		if !ok {
			return fmt.Errorf("%q is not an order id (a UUID)", raw)
		}
		b, p := l.Of(id)
		fmt.Fprintf(tw, "%s\t%d\t%s\n", id, b, p.Name)
	}
	return tw.Flush()
}

// layout is the deployment's partitions layout (SAS_PARTITIONS_FILE), or
// nil for a deployment of one state store.
func (a *app) layout() (*partition.Layout, error) {
	file := os.Getenv("SAS_PARTITIONS_FILE")
	if file == "" {
		return nil, nil
	}
	l, err := partition.Load(file)
	if err != nil {
		return nil, err
	}
	return &l, nil
}

// partitionStore opens partition p's state store, its URL in the
// variable the layout names.
func (a *app) partitionStore(ctx context.Context, p partition.Partition) (*statestore.Store, func(), error) {
	url := os.Getenv(p.DatabaseURLEnv)
	if url == "" {
		return nil, nil, fmt.Errorf("partition %s: %s is not set: it holds the partition's database URL", p.Name, p.DatabaseURLEnv)
	}
	o := a.cfg.Database(2)
	o.URL = url // with SAS_DATABASE_PASSWORD, when set, as every service
	pool, err := a.poolWith(ctx, o)
	if err != nil {
		return nil, nil, fmt.Errorf("partition %s: %w", p.Name, err)
	}
	store := statestore.New(pool)
	checkCtx, cancel := context.WithTimeout(ctx, service.DatabaseWait)
	defer cancel()
	if err := store.CheckSchema(checkCtx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("partition %s: %w", p.Name, err)
	}
	return store, pool.Close, nil
}

// storeOf opens the state store holding order id: in a partitioned
// deployment its partition's, else SAS_DATABASE_URL's.
func (a *app) storeOf(ctx context.Context, id string) (*statestore.Store, func(), error) {
	l, err := a.layout()
	if err != nil || l == nil {
		if err != nil {
			return nil, nil, err
		}
		return a.store(ctx)
	}
	stores, closeStores, err := a.partitionStores(ctx, l)
	if err != nil {
		return nil, nil, err
	}
	return stores.Of(ctx, id), closeStores, nil
}

// partitionStores opens every partition's store of layout l as one,
// following the buckets moved.
func (a *app) partitionStores(ctx context.Context, l *partition.Layout) (partition.Stores, func(), error) {
	var parts []partition.Store
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for _, p := range l.Partitions {
		store, closeStore, err := a.partitionStore(ctx, p)
		if err != nil {
			closeAll()
			return partition.Stores{}, nil, err
		}
		parts = append(parts, partition.Store{Name: p.Name, Store: store})
		closers = append(closers, closeStore)
	}
	stores := partition.NewStores(l, parts)
	if err := stores.Follow(ctx); err != nil {
		closeAll()
		return partition.Stores{}, nil, err
	}
	return stores, closeAll, nil
}

// partitionedStore is one partition's open store.
type partitionedStore struct {
	name  string
	store *statestore.Store
}

// everyStore opens every partition's store in a partitioned deployment
// (each named), else SAS_DATABASE_URL's alone (named "").
func (a *app) everyStore(ctx context.Context) ([]partitionedStore, func(), error) {
	l, err := a.layout()
	if err != nil {
		return nil, nil, err
	}
	if l == nil {
		store, closeStore, err := a.store(ctx)
		if err != nil {
			return nil, nil, err
		}
		return []partitionedStore{{"", store}}, closeStore, nil
	}
	stores, closeAll, err := a.partitionStores(ctx, l)
	if err != nil {
		return nil, nil, err
	}
	out := make([]partitionedStore, len(stores.Parts))
	for i, p := range stores.Parts {
		out[i] = partitionedStore{p.Name, p.Store}
	}
	return out, closeAll, nil
}

// newestFirst merges pages of orders, each newest first, into one page
// of at most limit, newest first: (created_at, order_id) descending, the
// order every keyset list of orders keeps.
func newestFirst(pages [][]statestore.Order, limit int) []statestore.Order {
	var all []statestore.Order
	for _, p := range pages {
		all = append(all, p...)
	}
	slices.SortStableFunc(all, func(x, y statestore.Order) int {
		if c := y.CreatedAt.Compare(x.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(y.OrderID, x.OrderID)
	})
	return all[:min(limit, len(all))]
}
