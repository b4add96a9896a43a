package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"sas/internal/statestore"
)

// A service's start rides out a database that blinks, and stops at once
// on what retrying cannot fix.
func TestRetryDBRetriesWhatMayPass(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	calls := 0
	err := RetryDB(context.Background(), logger, "reading", func() error {
		calls++
		if calls < 3 {
			return errors.New("read tcp: connection reset by peer")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("after two cuts: %v, %d calls", err, calls)
	}
	calls = 0
	err = RetryDB(context.Background(), logger, "writing", func() error {
		calls++
		return fmt.Errorf("value: %w", statestore.ErrInvalidData)
	})
	if !errors.Is(err, statestore.ErrInvalidData) || calls != 1 {
		t.Fatalf("a value refused: %v, %d calls", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := RetryDB(ctx, logger, "reading", func() error { return errors.New("down") }); err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("a stopped start: %v (kept retrying, or not a clean stop)", err)
	}
}

// What the server answered is retried only where it may answer otherwise
// later; a lost connection always is.
func TestRetryDBStopsOnWhatTheServerRefuses(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		err   error
		again bool
	}{
		{errors.New("unexpected EOF"), true},
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "55P03"}, true},
		{&pgconn.PgError{Code: "53300"}, true},
		{&pgconn.PgError{Code: "25006"}, true},
		{&pgconn.PgError{Code: "42P01", Message: `relation "orders" does not exist`}, false},
		{&pgconn.PgError{Code: "P0001", Message: "a store function's refusal"}, false},
		{&pgconn.PgError{Code: "28P01"}, false},
	} {
		calls := 0
		err := RetryDB(context.Background(), logger, "starting", func() error {
			calls++
			if calls == 1 {
				return fmt.Errorf("start: %w", c.err)
			}
			return nil
		})
		if c.again && (err != nil || calls != 2) {
			t.Errorf("%v: not retried (%v, %d calls)", c.err, err, calls)
		}
		if !c.again && (err == nil || calls != 1) {
			t.Errorf("%v: retried (%v, %d calls)", c.err, err, calls)
		}
	}
}
