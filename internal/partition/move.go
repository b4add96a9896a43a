package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"sas/internal/failpoint"
	"sas/internal/statestore"
)

// Moving a bucket to another partition while orders flow
// (docs/SCALING.md). An order stays in the store that wrote it: a move
// changes which partition writes the bucket's new orders, and no running
// order changes store, so none of its steps can run twice or be lost.
// What must never happen is a submit retried across the move written
// twice, once by each owner; the move makes that impossible:
//
//  1. The ids the old owner wrote in the bucket (and those its earlier
//     owners wrote) are copied to the new owner's moved_orders.
//  2. The new owner records itself the owner, moving: it holds the
//     bucket's submits (statestore.ErrMoving) until step 5.
//  3. The old owner is fenced: under its fence lock, taken alone once
//     its writes in flight have ended, it records the new owner; it never
//     writes an order of the bucket again, and passes its submits on.
//  4. The ids are copied again: now every id the old owner will ever
//     hold of the bucket is in the new owner's moved_orders.
//  5. Every partition records the bucket moved: the new owner writes its
//     orders, each one an earlier owner wrote settled as a duplicate.
//  6. The bucket's exchange is bound to the new owner's entrance, then
//     unbound from the old one's.
//  7. The move drains: done once none of the bucket's orders is running
//     in the old owner.
//
// Each step can be run again, so a move stopped half way (its process
// killed, a store unreachable) resumes where it was when started again.

// moveIDPage is how many order ids a move reads from the old owner at a
// time.
const moveIDPage = 10000

// Move moves bucket b to partition to, recorded in the first
// partition's store as by's; progress hears of each step. With wait it
// returns once the move is done (its bucket's orders ended in the old
// owner), else once the new owner writes the bucket's orders (draining).
func (s Stores) Move(ctx context.Context, ch Binder, b int, to, by string, wait bool, progress func(statestore.BucketMove)) (statestore.BucketMove, error) {
	l := s.Layout
	if l == nil {
		return statestore.BucketMove{}, errors.New("not a partitioned deployment: give its layout (SAS_PARTITIONS_FILE)")
	}
	if b < 0 || b >= l.Buckets {
		return statestore.BucketMove{}, fmt.Errorf("bucket %d: want 0 to %d", b, l.Buckets-1)
	}
	ti := l.Index(to)
	if ti < 0 {
		return statestore.BucketMove{}, fmt.Errorf("partition %q is not in the layout", to)
	}
	if err := s.Follow(ctx); err != nil {
		return statestore.BucketMove{}, err
	}
	home := s.Parts[0]
	if err := s.SettleMoves(ctx); err != nil {
		return statestore.BucketMove{}, err
	}
	m, open, err := home.Store.OpenMove(ctx, b)
	if err != nil {
		return statestore.BucketMove{}, home.Named(err)
	}
	switch {
	case open && m.To != to:
		return m, fmt.Errorf("bucket %d is moving from %s to %s (move %d): finish that move first", b, m.From, m.To, m.ID)
	case !open && l.Owner(b) == ti:
		// Moved there already: wait for its drain, if it drains still.
		draining, err := home.Store.DrainingMoves(ctx)
		if err != nil {
			return statestore.BucketMove{}, home.Named(err)
		}
		i := slices.IndexFunc(draining, func(d statestore.BucketMove) bool { return d.Bucket == b && d.To == to })
		if i < 0 {
			return statestore.BucketMove{}, fmt.Errorf("bucket %d is partition %s's already", b, to)
		}
		m = draining[i]
	case !open:
		if m, err = home.Store.StartMove(ctx, b, l.Partitions[l.Owner(b)].Name, to, by); err != nil {
			return m, home.Named(err)
		}
	}
	fi := l.Index(m.From)
	if fi < 0 {
		return m, fmt.Errorf("move %d is from partition %s, which is not in the layout", m.ID, m.From)
	}
	from, dest := s.Parts[fi], s.Parts[ti]
	note := func(state string, copied, running int64) error {
		m.State, m.Copied, m.Running = state, copied, running
		if progress != nil {
			progress(m)
		}
		return home.Named(home.Store.UpdateMove(ctx, m.ID, state, copied, running))
	}

	if m.State == "copying" {
		// 1. The ids written so far, while the old owner writes on.
		copied, _, err := s.copyIDs(ctx, from, dest, b)
		if err != nil {
			return m, err
		}
		if err := note("copying", copied, 0); err != nil {
			return m, err
		}
		// 2. The new owner holds the bucket's submits from now until it
		// writes them (the others pass theirs to the old owner, which
		// passes them on once fenced).
		if err := dest.Store.SetBucketOwner(ctx, b, to, true); err != nil {
			return m, dest.Named(err)
		}
		// 3. The fence.
		if err := from.Store.FenceBucket(ctx, b, to); err != nil {
			return m, from.Named(err)
		}
		failpoint.Inject("move-after-fence")
		// 4. The ids written up to the fence.
		copied, running, err := s.copyIDs(ctx, from, dest, b)
		if err != nil {
			return m, err
		}
		// 5. Moved: the new owner first.
		for _, i := range append([]int{ti}, others(len(s.Parts), ti)...) {
			if err := s.Parts[i].Store.SetBucketOwner(ctx, b, to, false); err != nil {
				return m, s.Parts[i].Named(err)
			}
		}
		if err := s.Follow(ctx); err != nil {
			return m, err
		}
		// 6. The broker.
		if err := l.BindBucket(ch, b); err != nil {
			return m, err
		}
		if err := note("draining", copied, running); err != nil {
			return m, err
		}
	}
	// 7. Draining.
	for {
		running, err := s.runningIn(ctx, from, b)
		if err != nil {
			return m, err
		}
		if running == 0 {
			return m, note("done", m.Copied, 0)
		}
		if err := note("draining", m.Copied, running); err != nil || !wait {
			return m, err
		}
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// SettleMoves records how far every draining move got, and those whose
// bucket's orders have all ended in the old owner as done.
func (s Stores) SettleMoves(ctx context.Context) error {
	home := s.Parts[0]
	draining, err := home.Store.DrainingMoves(ctx)
	if err != nil {
		return home.Named(err)
	}
	for _, m := range draining {
		fi := s.Layout.Index(m.From)
		if fi < 0 {
			continue
		}
		running, err := s.runningIn(ctx, s.Parts[fi], m.Bucket)
		if err != nil {
			return err
		}
		state := "draining"
		if running == 0 {
			state = "done"
		}
		if err := home.Store.UpdateMove(ctx, m.ID, state, m.Copied, running); err != nil {
			return home.Named(err)
		}
	}
	return nil
}

// others is 0..n-1 without skip.
func others(n, skip int) []int {
	var out []int
	for i := range n {
		if i != skip {
			out = append(out, i)
		}
	}
	return out
}

// copyIDs copies the ids of bucket b's orders in from's store, and
// those its earlier owners wrote (its moved_orders: a bucket moved on
// again takes them along), to dest's moved_orders, and counts them and
// those still running in from.
func (s Stores) copyIDs(ctx context.Context, from, dest Store, b int) (copied, running int64, err error) {
	for _, read := range []func(context.Context, string, int) ([]statestore.OrderID, error){from.Store.OrderIDs, from.Store.MovedOrderIDs} {
		for after := ""; ; {
			page, err := read(ctx, after, moveIDPage)
			if err != nil {
				return 0, 0, from.Named(err)
			}
			var mine []statestore.OrderID
			for _, o := range page {
				if s.Layout.BucketOf(o.OrderID) == b {
					mine = append(mine, o)
					if !o.Ended {
						running++
					}
				}
			}
			if err := dest.Store.CopyMovedOrders(ctx, from.Name, mine); err != nil {
				return 0, 0, dest.Named(err)
			}
			copied += int64(len(mine))
			if len(page) < moveIDPage {
				break
			}
			after = page[len(page)-1].OrderID
		}
	}
	return copied, running, nil
}

// runningIn counts bucket b's orders still running in from's store.
func (s Stores) runningIn(ctx context.Context, from Store, b int) (int64, error) {
	var n int64
	for after := ""; ; {
		page, err := from.Store.RunningOrderIDs(ctx, after, moveIDPage)
		if err != nil {
			return 0, from.Named(err)
		}
		for _, id := range page {
			if s.Layout.BucketOf(id) == b {
				n++
			}
		}
		if len(page) < moveIDPage {
			return n, nil
		}
		after = page[len(page)-1]
	}
}
