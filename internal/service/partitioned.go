package service

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"sas/internal/partition"
	"sas/internal/statestore"
)

// Partitioned is where a process stands in a partitioned deployment
// (docs/SCALING.md): the layout every process of it shares and, for a
// process of one partition (submitter, scheduler, agent, supervisor),
// which one. Both empty: one state store, as always.
type Partitioned struct {
	// PartitionsFile is the deployment's layout (SAS_PARTITIONS_FILE).
	PartitionsFile string `envconfig:"PARTITIONS_FILE"`
	// Partition is this process's partition in it (SAS_PARTITION): its
	// queue_prefix must be SAS_QUEUE_PREFIX, and its metrics carry a
	// partition label of its name.
	Partition string `envconfig:"PARTITION"`
}

// Layout reads the deployment's layout: nil when it is not partitioned.
func (p Partitioned) Layout() (*partition.Layout, error) {
	if p.PartitionsFile == "" {
		return nil, nil
	}
	l, err := partition.Load(p.PartitionsFile)
	if err != nil {
		return nil, err
	}
	return &l, nil
}

// Own reads the layout and finds this process's partition in it, whose
// queue prefix must be queuePrefix (nil, 0 when the deployment is not
// partitioned).
func (p Partitioned) Own(queuePrefix string) (*partition.Layout, int, error) {
	if p.PartitionsFile == "" {
		if p.Partition != "" {
			return nil, 0, fmt.Errorf("SAS_PARTITION %q needs SAS_PARTITIONS_FILE, the layout it is a partition of", p.Partition)
		}
		return nil, 0, nil
	}
	l, err := p.Layout()
	if err != nil {
		return nil, 0, err
	}
	i := slices.IndexFunc(l.Partitions, func(q partition.Partition) bool { return q.Name == p.Partition })
	if i < 0 {
		return nil, 0, fmt.Errorf("SAS_PARTITION %q is not a partition of %s (%d partitions)", p.Partition, p.PartitionsFile, len(l.Partitions))
	}
	if l.Partitions[i].QueuePrefix != queuePrefix {
		return nil, 0, fmt.Errorf("partition %s's queue_prefix is %q in %s, but SAS_QUEUE_PREFIX is %q", p.Partition, l.Partitions[i].QueuePrefix, p.PartitionsFile, queuePrefix)
	}
	return l, i, nil
}

// OpenPartitions opens every partition's state store of layout l, each
// URL read from the variable the layout names, with db's other settings
// (its password too, replacing the URL's when set);
// each is waited for as OpenDatabase does. It returns them in the
// layout's order and the function that closes them all.
func OpenPartitions(ctx context.Context, l *partition.Layout, db statestore.Options, ops *OpsServer, logger *slog.Logger) (partition.Stores, func(), error) {
	var parts []partition.Store
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for _, p := range l.Partitions {
		url := os.Getenv(p.DatabaseURLEnv)
		if url == "" {
			closeAll()
			return partition.Stores{}, nil, fmt.Errorf("partition %s: %s is not set: it holds the partition's database URL", p.Name, p.DatabaseURLEnv)
		}
		// The process's password (SAS_DATABASE_PASSWORD), when it has
		// one, is its login's in every partition's database too.
		o := db
		o.URL = url
		store, closeStore, err := OpenDatabase(ctx, o, ops, logger.With("partition", p.Name))
		if err != nil {
			closeAll()
			return partition.Stores{}, nil, fmt.Errorf("partition %s: %w", p.Name, err)
		}
		if err := RetryDB(ctx, logger, "checking partition "+p.Name+"'s schema", func() error { return store.CheckSchema(ctx) }); err != nil {
			closeStore()
			closeAll()
			return partition.Stores{}, nil, fmt.Errorf("partition %s: %w", p.Name, err)
		}
		parts = append(parts, partition.Store{Name: p.Name, Store: store})
		closers = append(closers, closeStore)
	}
	out := partition.NewStores(l, parts)
	if err := RetryDB(ctx, logger, "reading the buckets moved", func() error { return out.Follow(ctx) }); err != nil {
		closeAll()
		return partition.Stores{}, nil, err
	}
	return out, closeAll, nil
}

// labelled is a gatherer that adds one label to every metric of another,
// where the metric lacks it: a process of one partition so labels all it
// exports, the Go runtime's and the broker client's metrics included.
type labelled struct {
	g           prometheus.Gatherer
	name, value string
}

func (l labelled) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := l.g.Gather()
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			if !slices.ContainsFunc(m.Label, func(lp *dto.LabelPair) bool { return lp.GetName() == l.name }) {
				m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l.name), Value: proto.String(l.value)})
				// Exposition wants the labels sorted by name.
				slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int {
					switch {
					case a.GetName() < b.GetName():
						return -1
					case a.GetName() > b.GetName():
						return 1
					}
					return 0
				})
			}
		}
	}
	return mfs, err
}
