package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

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
	if err := RetryDB(ctx, logger, "reading", func() error { return errors.New("down") }); err == nil {
		t.Fatal("a stopped start kept retrying")
	}
}
