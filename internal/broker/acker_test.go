package broker

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// recorder is an acknowledger that keeps the frames it was sent.
type recorder struct {
	mu     sync.Mutex
	frames []string
}

func (r *recorder) Ack(tag uint64, multiple bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frames = append(r.frames, fmt.Sprintf("ack %d %v", tag, multiple))
	return nil
}

func (r *recorder) Nack(tag uint64, multiple, requeue bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frames = append(r.frames, fmt.Sprintf("nack %d %v %v", tag, multiple, requeue))
	return nil
}

func (r *recorder) sent() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.frames)
}

// settledBy replays frames as RabbitMQ would: which tags each settles,
// failing on a frame for a tag that is not outstanding.
func settledBy(t *testing.T, frames []string, delivered uint64) map[uint64]string {
	t.Helper()
	outstanding := map[uint64]bool{}
	for tag := uint64(1); tag <= delivered; tag++ {
		outstanding[tag] = true
	}
	settled := map[uint64]string{}
	for _, f := range frames {
		var kind string
		var tag uint64
		var multiple bool
		if _, err := fmt.Sscanf(f, "%s %d %t", &kind, &tag, &multiple); err != nil {
			t.Fatalf("frame %q: %v", f, err)
		}
		if !outstanding[tag] {
			t.Fatalf("frame %q names a tag that is not outstanding (frames %v)", f, frames)
		}
		for x := uint64(1); x <= tag; x++ {
			if outstanding[x] && (x == tag || multiple) {
				delete(outstanding, x)
				settled[x] = kind
			}
		}
	}
	return settled
}

func TestAckerGroupsAcks(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	a := newAcker(r, 64, func() {}, func(err error) { t.Error(err) })
	in := make(chan settlement, 100)
	// 2..10 are settled, 1 is still being handled; 5 is requeued.
	for tag := uint64(2); tag <= 10; tag++ {
		in <- settlement{tag: tag, requeue: tag == 5}
	}
	done := make(chan struct{})
	go func() { defer close(done); a.run(in) }()
	// The requeue goes at once; the acks behind 1 wait, then go alone.
	deadline := time.Now().Add(10 * time.Second)
	for len(r.sent()) < 9 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	frames := r.sent()
	if len(frames) != 9 || frames[0] != "nack 5 false true" {
		t.Fatalf("frames with tag 1 in hand: %v, want the nack then 8 single acks", frames)
	}
	for _, f := range frames[1:] {
		if f[len(f)-5:] != "false" {
			t.Fatalf("a multiple ack while tag 1 is in hand: %v", frames)
		}
	}
	// Now 1 and 11..40 settle together: one frame for the run.
	in <- settlement{tag: 1}
	for tag := uint64(11); tag <= 40; tag++ {
		in <- settlement{tag: tag}
	}
	close(in)
	<-done
	frames = r.sent()
	settled := settledBy(t, frames, 40)
	if len(settled) != 40 || settled[5] != "nack" {
		t.Fatalf("settled %v by %v", settled, frames)
	}
	if len(frames) > 11 {
		t.Fatalf("%d frames for 40 deliveries: %v", len(frames), frames)
	}
}

// clockedAcker is an acker for a prefetch of 64 whose clock moves only
// when the test moves it, and the recorder of its frames.
func clockedAcker(t *testing.T) (*acker, *recorder, *time.Time) {
	r := &recorder{}
	clock := time.Unix(0, 0)
	a := newAcker(r, 64, func() {}, func(err error) { t.Error(err) })
	a.now = func() time.Time { return clock }
	return a, r, &clock
}

func TestAckerNeverAcksPastAnUnsettledDelivery(t *testing.T) {
	t.Parallel()
	a, r, clock := clockedAcker(t)
	// Settlements in a scrambled order, flushed after each.
	order := []uint64{3, 1, 2, 7, 5, 4, 9, 6, 8, 10}
	for i, tag := range order {
		a.add(settlement{tag: tag, requeue: tag == 4})
		*clock = clock.Add(ackLinger)
		a.flush(false)
		settled := settledBy(t, r.sent(), 10)
		for x := range settled {
			if !slices.Contains(order[:i+1], x) {
				t.Fatalf("after %v, tag %d was settled before its handler finished (frames %v)", order[:i+1], x, r.sent())
			}
		}
	}
	a.flush(true)
	if settled := settledBy(t, r.sent(), 10); len(settled) != 10 || settled[4] != "nack" {
		t.Fatalf("settled %v by %v", settled, r.sent())
	}
}

func TestAckerSendsALoneAckAtOnce(t *testing.T) {
	t.Parallel()
	a, r, clock := clockedAcker(t)
	// A delivery that comes alone (low load): acked at once, no linger.
	a.add(settlement{tag: 1})
	a.flush(false)
	if got := r.sent(); !slices.Equal(got, []string{"ack 1 true"}) {
		t.Fatalf("a lone ack: frames %v, want it sent at once", got)
	}
	if a.wake != nil {
		t.Fatal("a lone ack sent at once left a timer armed")
	}
	// Two more within ackLinger of that frame wait to go together.
	*clock = clock.Add(ackLinger / 4)
	a.add(settlement{tag: 2})
	a.flush(false)
	*clock = clock.Add(ackLinger / 4)
	a.add(settlement{tag: 3})
	a.flush(false)
	if got := r.sent(); len(got) != 1 || a.wake == nil {
		t.Fatalf("acks within ackLinger of the last frame: frames %v (timer armed %v), want them held", got, a.wake != nil)
	}
	*clock = clock.Add(ackLinger / 2)
	a.flush(false)
	if got := r.sent(); !slices.Equal(got, []string{"ack 1 true", "ack 3 true"}) {
		t.Fatalf("ackLinger after the last frame: frames %v, want one frame for 2 and 3", got)
	}
	// Long after, the next lone ack goes at once again.
	*clock = clock.Add(time.Second)
	a.add(settlement{tag: 4})
	a.flush(false)
	if got := r.sent(); len(got) != 3 || got[2] != "ack 4 true" {
		t.Fatalf("a lone ack a second later: frames %v", got)
	}
}
