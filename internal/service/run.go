package service

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// RunAll runs loops, each with ctx, until ctx is done or one of them fails.
// On ctx done (SIGTERM) the loops stop taking work and finish what they
// hold; if they have not returned within shutdownTimeout, cancelWork cuts
// the work still in progress. It returns the first error a loop returned
// while ctx was still live, or nil.
func RunAll(ctx context.Context, shutdownTimeout time.Duration, cancelWork context.CancelFunc, logger *slog.Logger, loops ...func(context.Context) error) error {
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	errc := make(chan error, len(loops))
	for _, loop := range loops {
		go func() { errc <- loop(loopCtx) }()
	}
	var first error
	running := len(loops)
	select {
	case err := <-errc:
		running--
		if ctx.Err() == nil {
			first = err
			if first == nil {
				first = errors.New("a loop stopped on its own")
			}
		}
	case <-ctx.Done():
	}
	stopLoops()
	logger.Info("shutting down: finishing work in hand", "timeout", shutdownTimeout.String())
	timeout := time.NewTimer(shutdownTimeout)
	defer timeout.Stop()
	for running > 0 {
		select {
		case <-errc:
			running--
		case <-timeout.C:
			logger.Warn("shutdown timeout passed; cutting work in progress, unfinished messages go back to their queues")
			cancelWork()
			for ; running > 0; running-- {
				<-errc
			}
		}
	}
	logger.Info("stopped")
	return first
}
