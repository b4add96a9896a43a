package statestore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started is
// still running when they end: every loop is stopped and waited for.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
