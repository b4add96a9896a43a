package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"sas/internal/service"
)

// TestMain fails the package's tests if any goroutine they started is
// still running when they end: every loop is stopped and waited for.
//
// Run with SAS_SERVICE_TEST_MAIN=serve, the test binary is a service
// instead (service.Main with a body that says it runs and waits for its
// stop): the tests that need a real process start it so.
func TestMain(m *testing.M) {
	if os.Getenv("SAS_SERVICE_TEST_MAIN") == "serve" {
		os.Exit(service.Main("servicetest", func(ctx context.Context, _ testServiceConfig, _ *slog.Logger) error {
			fmt.Printf("running, marker %q\n", os.Getenv("SAS_TIMER_SLACK_EXECUTED"))
			<-ctx.Done()
			return nil
		}))
	}
	goleak.VerifyTestMain(m)
}

// testServiceConfig is the configuration of the service TestMain runs.
type testServiceConfig struct {
	LogLevel string `envconfig:"LOG_LEVEL" default:"info"`
}

func (c testServiceConfig) Level() string { return c.LogLevel }
