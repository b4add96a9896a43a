package scheduler

import (
	"context"
	"log/slog"

	"sas/internal/service"
)

// resender puts back to pending, each time the broker connection comes
// back after a drop, the steps this scheduler had sent: with transient
// step messages (SAS_STEP_MESSAGES, docs/RELIABILITY.md) a broker that
// restarted lost their requests, or the replies to them, and without this
// they would wait for their complete_by to pass. A request the broker
// still held is answered as stale; its call is made again under the same
// idempotency key.
type resender struct {
	store       sentStore
	me          string
	restored    <-chan struct{}
	wakeClaimer func()
	logger      *slog.Logger
	metrics     *metrics
}

// sentStore is what the resender needs of the store.
type sentStore interface {
	ReleaseSent(ctx context.Context, actor, reason string) (int, error)
}

func (r *resender) run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.restored:
		}
		r.metrics.wakeups.WithLabelValues("resend", "reconnect").Inc()
		var n int
		err := service.RetryDB(ctx, r.logger, "putting back the steps sent before the broker connection dropped", func() (err error) {
			n, err = r.store.ReleaseSent(ctx, r.me, "broker connection lost: its request or reply may be gone")
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.logger.Error("could not put back the steps sent before the broker connection dropped; the supervisor will, at their complete_by", "err", err)
			continue
		}
		r.metrics.resent.Add(float64(n))
		if n > 0 {
			r.logger.Warn("broker connection came back; steps sent before it dropped put back to pending", "steps", n)
			r.wakeClaimer()
		}
	}
}
