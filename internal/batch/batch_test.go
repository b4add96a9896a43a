package batch_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"sas/internal/batch"
)

func TestBatcherGathersAndAnswersByIndex(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	b := batch.New(8, 0, func(_ context.Context, items []int) ([]string, []error) {
		<-release
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		outs := make([]string, len(items))
		errs := make([]error, len(items))
		for i, n := range items {
			if n%5 == 0 {
				errs[i] = fmt.Errorf("no %d", n)
				continue
			}
			outs[i] = fmt.Sprint(n * 10)
		}
		return outs, errs
	})
	go b.Run(ctx, 2)
	const n = 40
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for i := 1; i <= n; i++ {
		wg.Go(func() {
			out, err := b.Do(ctx, i)
			switch {
			case i%5 == 0 && (err == nil || err.Error() != fmt.Sprintf("no %d", i)):
				errc <- fmt.Errorf("item %d: err %v, want its own error", i, err)
			case i%5 != 0 && (err != nil || out != fmt.Sprint(i*10)):
				errc <- fmt.Errorf("item %d: %q %v, want %d", i, out, err, i*10)
			}
		})
	}
	close(release)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	total, most := 0, 0
	for _, s := range sizes {
		total += s
		most = max(most, s)
	}
	if total != n || most > 8 {
		t.Fatalf("batch sizes %v: want %d items in all, none over 8", sizes, n)
	}
}

func TestBatcherStopped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	b := batch.New(4, 0, func(_ context.Context, items []int) ([]int, []error) {
		return items, make([]error, len(items))
	})
	done := make(chan struct{})
	go func() { b.Run(ctx, 3); close(done) }()
	if out, err := b.Do(context.Background(), 7); err != nil || out != 7 {
		t.Fatalf("Do: %d %v", out, err)
	}
	cancel()
	<-done
	if _, err := b.Do(context.Background(), 1); !errors.Is(err, batch.ErrStopped) {
		t.Fatalf("Do after Run ended: %v, want ErrStopped", err)
	}
	callerCtx, stop := context.WithCancel(context.Background())
	stop()
	if _, err := batch.New(1, 0, func(context.Context, []int) ([]int, []error) { return nil, nil }).Do(callerCtx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with an ended context and no loop: %v", err)
	}
}

// sizesOf runs a Batcher whose batches report their sizes.
func sizesOf(t *testing.T, maxItems int, linger time.Duration) (*batch.Batcher[int, int], func() []int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var mu sync.Mutex
	var sizes []int
	b := batch.New(maxItems, linger, func(_ context.Context, items []int) ([]int, []error) {
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		return items, make([]error, len(items))
	})
	go b.Run(ctx, 1)
	return b, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sizes)
	}
}

func TestBatcherLingersForMore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Without a linger, a lone item is its own batch: the second item
	// comes once the first was run.
	b, sizes := sizesOf(t, 2, 0)
	if _, err := b.Do(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Do(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := sizes(); !slices.Equal(got, []int{1, 1}) {
		t.Errorf("no linger: batches %v, want [1 1]", got)
	}
	// With a 10 s linger: the first item comes after a lull and goes
	// alone at once; the next, right behind it, waits, and an item 50 ms
	// behind that joins its batch, which runs at once when full.
	b, sizes = sizesOf(t, 2, 10*time.Second)
	start := time.Now()
	if _, err := b.Do(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the first item, after a lull, waited %v", took)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := b.Do(ctx, 2); err != nil {
			t.Error(err)
		}
	})
	time.Sleep(50 * time.Millisecond) // the gap between the two items
	start = time.Now()
	if _, err := b.Do(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := sizes(); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("10 s linger: batches %v, want [1 2]", got)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a full batch waited %v", took)
	}
}

func TestBatcherLingerEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, sizes := sizesOf(t, 8, 20*time.Millisecond)
	if _, err := b.Do(ctx, 6); err != nil {
		t.Fatal(err)
	}
	// Right behind the first, a lone item waits out the linger for more.
	start := time.Now()
	if out, err := b.Do(ctx, 7); err != nil || out != 7 {
		t.Fatalf("Do: %d %v", out, err)
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Errorf("a lone item was answered after %v, before the linger", took)
	}
	if got := sizes(); !slices.Equal(got, []int{1, 1}) {
		t.Errorf("batches %v, want [1 1]", got)
	}
}

func TestBatcherDoesNotLingerAfterALull(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const linger = time.Second
	b, sizes := sizesOf(t, 8, linger)
	if _, err := b.Do(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// An item that comes more than the linger after the one before it
	// goes at once: nothing suggests another is on its way.
	time.Sleep(linger + 200*time.Millisecond) // the lull
	start := time.Now()
	if _, err := b.Do(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= linger/2 {
		t.Errorf("an item after a lull was answered after %v, want well before the %v linger", took, linger)
	}
	if got := sizes(); !slices.Equal(got, []int{1, 1}) {
		t.Errorf("batches %v, want [1 1]", got)
	}
}

func TestBatcherLullIsBetweenItemsHandedIn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const linger = 500 * time.Millisecond
	started, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	b := batch.New(8, linger, func(_ context.Context, items []int) ([]int, []error) {
		first.Do(func() { close(started); <-release })
		return items, make([]error, len(items))
	})
	go b.Run(ctx, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := b.Do(ctx, 1); err != nil {
			t.Error(err)
		}
	})
	// Item 2 is handed in right behind item 1, while the loop is held
	// in item 1's batch for longer than the linger. That long batch is no
	// lull: item 2, once taken, still waits the linger for more.
	<-started
	done := make(chan time.Time, 1)
	wg.Go(func() {
		if _, err := b.Do(ctx, 2); err != nil {
			t.Error(err)
		}
		done <- time.Now()
	})
	time.Sleep(linger + 200*time.Millisecond) // the loop busy with item 1
	released := time.Now()
	close(release)
	wg.Wait()
	if took := (<-done).Sub(released); took < linger {
		t.Errorf("item 2 was answered %v after the loop was free, before the %v linger", took, linger)
	}
}
