// Package batch gathers concurrent calls into batches. Callers hand in one
// item each and wait for its result; one loop takes whatever has gathered
// (up to a maximum) and handles it as one batch, for instance one database
// transaction and one round trip instead of one per item. It never waits
// for a batch to fill: under light load a batch is one item and adds no
// delay; under heavy load items gather while the previous batch runs. A
// linger, when set, trades that much delay for larger batches under
// moderate load: a batch that is not full waits up to the linger, from its
// first item, for more. Not after a lull: an item that comes alone, longer
// than the linger after the one before it (or as the first), gives no sign
// that another is close behind, so its batch goes at once, without a delay
// and a timer's wake-up that would most likely buy nothing.
package batch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrStopped is returned to callers once the loop has ended.
var ErrStopped = errors.New("batch: stopped")

// Func handles a batch; it returns one result and one error per item, by
// index.
type Func[In, Out any] func(ctx context.Context, items []In) ([]Out, []error)

// Batcher gathers calls of Do into batches run by Run.
type Batcher[In, Out any] struct {
	max    int
	linger time.Duration
	run    Func[In, Out]
	calls  chan call[In, Out]
	done   chan struct{}
	// start is the batcher's zero time; last is when the latest item was
	// handed in, in nanoseconds after start.
	start time.Time
	last  atomic.Int64
}

type call[In, Out any] struct {
	in    In
	reply chan result[Out]
	// afterLull: handed in longer than the linger after the item before.
	afterLull bool
}

type result[Out any] struct {
	out Out
	err error
}

// New returns a Batcher running batches of at most maxItems items with run;
// a batch that is not full waits up to linger (0: not at all) for more.
func New[In, Out any](maxItems int, linger time.Duration, run Func[In, Out]) *Batcher[In, Out] {
	b := &Batcher[In, Out]{max: max(maxItems, 1), linger: max(linger, 0), run: run,
		calls: make(chan call[In, Out]), done: make(chan struct{}), start: time.Now()}
	b.last.Store(-int64(b.linger) - 1) // the first item comes after a lull
	return b
}

// Do hands in one item and waits for its result. It returns ctx's error if
// ctx ends before the loop took the item, and ErrStopped if the loop has
// ended; once taken, an item is always answered.
func (b *Batcher[In, Out]) Do(ctx context.Context, in In) (Out, error) {
	// The gap is measured as items are handed in, not as a loop takes
	// them: a loop running a long batch takes nothing for a while, which
	// says nothing about how fast items come.
	now := int64(time.Since(b.start))
	c := call[In, Out]{in: in, reply: make(chan result[Out], 1), afterLull: now-b.last.Swap(now) > int64(b.linger)}
	var zero Out
	select {
	case b.calls <- c:
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-b.done:
		return zero, ErrStopped
	}
	r := <-c.reply
	return r.out, r.err
}

// Run runs loops loops that each take and run batches, so that up to loops
// batches run at once, until ctx ends; each batch runs under ctx. Run
// returns when every loop has ended. Call it once.
func (b *Batcher[In, Out]) Run(ctx context.Context, loops int) {
	defer close(b.done)
	var wg sync.WaitGroup
	for range max(loops, 1) {
		wg.Go(func() { b.loop(ctx) })
	}
	wg.Wait()
}

func (b *Batcher[In, Out]) loop(ctx context.Context) {
	calls := make([]call[In, Out], 0, b.max)
	items := make([]In, 0, b.max)
	for {
		calls, items = calls[:0], items[:0]
		select {
		case <-ctx.Done():
			return
		case c := <-b.calls:
			calls = append(calls, c)
		}
		afterLull := calls[0].afterLull
	gather:
		for len(calls) < b.max {
			select {
			case c := <-b.calls:
				calls = append(calls, c)
			default:
				break gather
			}
		}
		if !afterLull || len(calls) > 1 {
			calls = b.wait(ctx, calls)
		}
		for _, c := range calls {
			items = append(items, c.in)
		}
		outs, errs := b.run(ctx, items)
		for i, c := range calls {
			c.reply <- result[Out]{out: outs[i], err: errs[i]}
		}
	}
}

// wait adds to a batch that is not full what arrives within the linger
// after its first item.
func (b *Batcher[In, Out]) wait(ctx context.Context, calls []call[In, Out]) []call[In, Out] {
	if b.linger == 0 || len(calls) >= b.max {
		return calls
	}
	timer := time.NewTimer(b.linger)
	defer timer.Stop()
	for len(calls) < b.max {
		select {
		case c := <-b.calls:
			calls = append(calls, c)
		case <-timer.C:
			return calls
		case <-ctx.Done():
			return calls
		}
	}
	return calls
}
