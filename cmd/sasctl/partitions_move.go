package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"sas/internal/partition"
	"sas/internal/statestore"
)

// partitionsAdd adds a partition to the layout file, owning no bucket
// until buckets are moved to it.
func (a *app) partitionsAdd(ctx context.Context, args []string) error {
	fs := a.flags()
	file := fs.String("file", os.Getenv("SAS_PARTITIONS_FILE"), "the partitions layout to add to (default: SAS_PARTITIONS_FILE)")
	prefix := fs.String("queue-prefix", "", "the new partition's queue prefix (its services' SAS_QUEUE_PREFIX), e.g. sas.p4.")
	urlEnv := fs.String("database-url-env", "", "the environment variable holding its database URL, e.g. SAS_P4_DATABASE_URL")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give the new partition's name")
	}
	if *file == "" {
		return a.usageError(fs, "give the partitions layout: --file FILE or SAS_PARTITIONS_FILE")
	}
	l, err := partition.Load(*file)
	if err != nil {
		return err
	}
	l.Partitions = append(l.Partitions, partition.Partition{Name: rest[0], QueuePrefix: *prefix, DatabaseURLEnv: *urlEnv, Added: true})
	if err := l.Check(); err != nil {
		return fmt.Errorf("the layout with partition %s: %w", rest[0], err)
	}
	out, err := yaml.Marshal(map[string]any{"exchange": l.Exchange, "buckets": l.Buckets, "partitions": l.Partitions})
	if err != nil {
		return err
	}
	// Written whole, then renamed over the file: a reader never sees half.
	tmp, err := os.CreateTemp(filepath.Dir(*file), ".partitions-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(out); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), *file); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "added partition %s (%s, database URL in %s) to %s: it owns no bucket until one is moved to it\n",
		rest[0], *prefix, *urlEnv, *file)
	// It learns the buckets moved before it, when its store is there.
	if os.Getenv(*urlEnv) != "" && os.Getenv(l.Partitions[0].DatabaseURLEnv) != "" {
		first, closeFirst, err := a.partitionStore(ctx, l.Partitions[0])
		if err != nil {
			return err
		}
		defer closeFirst()
		added, closeAdded, err := a.partitionStore(ctx, l.Partitions[len(l.Partitions)-1])
		if err != nil {
			return fmt.Errorf("%w (run sasctl migrate against its database first)", err)
		}
		defer closeAdded()
		owners, err := first.BucketOwners(ctx)
		if err != nil {
			return err
		}
		for b, o := range owners {
			if err := added.SetBucketOwner(ctx, b, o.Owner, o.Moving); err != nil {
				return err
			}
		}
		fmt.Fprintf(a.stdout, "its store knows the %d buckets moved before it\n", len(owners))
	}
	fmt.Fprintf(a.stdout, `next:
  1. make its database, run sasctl migrate (and sasctl db users) against it
  2. give every process the new layout (restart them) and start its submitter, schedulers, supervisor
     and agents with SAS_PARTITION=%s, SAS_QUEUE_PREFIX=%s and its database
  3. run sasctl partitions setup, then sasctl partitions move BUCKET to %s
`, rest[0], *prefix, rest[0])
	return nil
}

// partitionsMove moves a bucket to another partition while orders flow.
func (a *app) partitionsMove(ctx context.Context, args []string) error {
	fs := a.flags()
	load := a.partitionsFlag(fs)
	noWait := fs.Bool("no-wait", false, "return once the new partition writes the bucket's orders, without waiting for the old one's to end")
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 3 && strings.EqualFold(rest[1], "to") {
		rest = []string{rest[0], rest[2]}
	}
	if len(rest) != 2 {
		return a.usageError(fs, "give the bucket and the partition: sasctl partitions move BUCKET to PARTITION")
	}
	b, err := strconv.Atoi(rest[0])
	if err != nil {
		return a.usageError(fs, "%q is not a bucket (a number, see sasctl partitions show)", rest[0])
	}
	l, err := load()
	if err != nil {
		return err
	}
	stores, closeStores, err := a.partitionStores(ctx, &l)
	if err != nil {
		return err
	}
	defer closeStores()
	ch, closeChannel, err := a.brokerChannel(ctx)
	if err != nil {
		return err
	}
	defer closeChannel()
	m, err := stores.Move(ctx, ch, b, rest[1], "sasctl:"+claimedName(*as), !*noWait, func(m statestore.BucketMove) {
		fmt.Fprintf(a.stdout, "move %d of bucket %d from %s to %s: %s, %d ids copied, %d of its orders running in %s\n",
			m.ID, m.Bucket, m.From, m.To, m.State, m.Copied, m.Running, m.From)
	})
	if err != nil {
		return err
	}
	if m.State == "done" {
		fmt.Fprintf(a.stdout, "bucket %d is partition %s's\n", b, m.To)
	} else {
		fmt.Fprintf(a.stdout, "bucket %d's new orders are partition %s's; %d still running in %s (sasctl partitions moves; run the move again to wait)\n",
			b, m.To, m.Running, m.From)
	}
	return nil
}

// partitionsMoves lists the moves of buckets, newest first.
func (a *app) partitionsMoves(ctx context.Context, args []string) error {
	fs := a.flags()
	load := a.partitionsFlag(fs)
	asJSON := fs.Bool("json", false, "print the moves as JSON")
	limit := fs.Int("limit", 50, "at most this many moves")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	l, err := load()
	if err != nil {
		return err
	}
	first, closeFirst, err := a.partitionStore(ctx, l.Partitions[0])
	if err != nil {
		return err
	}
	defer closeFirst()
	if !slices.ContainsFunc(l.Partitions, func(p partition.Partition) bool { return os.Getenv(p.DatabaseURLEnv) == "" }) {
		// Every partition's store at hand: the draining moves' counts as
		// they are now, and those drained recorded done.
		stores, closeStores, err := a.partitionStores(ctx, &l)
		if err != nil {
			return err
		}
		defer closeStores()
		if err := stores.SettleMoves(ctx); err != nil {
			return err
		}
	}
	moves, err := first.Moves(ctx, max(*limit, 1))
	if err != nil {
		return err
	}
	if *asJSON {
		return a.printJSON(moves)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MOVE\tBUCKET\tFROM\tTO\tSTATE\tIDS COPIED\tRUNNING IN FROM\tSTARTED\tENDED\tBY")
	for _, m := range moves {
		ended := "-"
		if m.EndedAt != nil {
			ended = m.EndedAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", m.ID, m.Bucket, m.From, m.To, m.State, m.Copied, m.Running,
			m.StartedAt.Local().Format(time.DateTime), ended, m.StartedBy)
	}
	return tw.Flush()
}

// followMoves makes l own the buckets as the first partition's store
// says, when its URL is set; it reports whether it could.
func (a *app) followMoves(ctx context.Context, l *partition.Layout) (bool, error) {
	if os.Getenv(l.Partitions[0].DatabaseURLEnv) == "" {
		return false, nil
	}
	first, closeFirst, err := a.partitionStore(ctx, l.Partitions[0])
	if err != nil {
		return false, err
	}
	defer closeFirst()
	return true, partition.NewFollower(l, first).Now(ctx)
}
