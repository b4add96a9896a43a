package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"sas/internal/statestore"
)

// Retry calls fn until it returns nil or an error isPermanent accepts,
// waiting between tries with exponential backoff from 50 ms to 5 s. It
// stops early, returning fn's last error, when stop is done: a service
// shutting down hands the message back instead of waiting for the
// database. onRetry (optional) is told about every retry.
func Retry(stop context.Context, fn func() error, isPermanent func(error) bool, onRetry func(err error, wait time.Duration)) error {
	wait := 50 * time.Millisecond
	for {
		err := fn()
		if err == nil || isPermanent(err) || stop.Err() != nil {
			return err
		}
		if onRetry != nil {
			onRetry(err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-stop.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// RetryDB runs fn, a read or write a service makes as it starts, until
// it succeeds, retrying with Retry's backoff after an error the database
// may get over (statestore.Retryable: a connection cut or refused, a
// server shutting down) and returning one that retrying cannot fix (a
// refused value, a missing table) or the one in hand when stop is done:
// a database that blinks while a service starts delays it rather than
// stopping it. Every statement a service runs between reaching its
// database and serving goes through it.
//
// An error returned because stop is done holds stop's error too, so that
// a SIGTERM while a service starts is a clean stop (Main).
func RetryDB(stop context.Context, logger *slog.Logger, what string, fn func() error) error {
	err := Retry(stop, fn, func(err error) bool { return !statestore.Retryable(err) },
		func(err error, wait time.Duration) {
			logger.Warn(what+" failed, retrying", "err", err, "retry_in", wait)
		})
	if err != nil && stop.Err() != nil && statestore.Retryable(err) {
		return errors.Join(err, stop.Err())
	}
	return err
}
