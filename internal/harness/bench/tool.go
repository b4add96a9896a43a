// Package bench is the whole-system benchmark (sasctl bench): every
// service run locally, orders offered at a rate or as fast as they are
// taken, and what a window after a warm-up measured (throughput, latency
// by stage, CPU and memory per process, queue depths, the write-ahead
// log); an A/B of two builds in one sitting; a backlog drained. It is the
// lab's: no service imports it.
package bench

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"

	"sas/internal/broker"
	"sas/internal/service"
)

// ErrUsage is a mistake in the command's flags; what was wrong is
// printed.
var ErrUsage = errors.New("bench: usage")

// Tool is what the benchmark needs of the command that runs it.
type Tool struct {
	cfg            service.Common
	logger         *slog.Logger
	stdout, stderr io.Writer
	flags          func() *flag.FlagSet
	parseNoArgs    func(*flag.FlagSet, []string) error
}

// NewTool gives the benchmark the command's configuration, logger and
// output, and how it makes and parses a flag set (as every other command
// of the tool does).
func NewTool(cfg service.Common, logger *slog.Logger, stdout, stderr io.Writer,
	flags func() *flag.FlagSet, parseNoArgs func(*flag.FlagSet, []string) error) *Tool {
	return &Tool{cfg: cfg, logger: logger, stdout: stdout, stderr: stderr, flags: flags, parseNoArgs: parseNoArgs}
}

func (a *Tool) openBroker(ctx context.Context, inputs ...string) (*broker.Conn, *broker.Publisher, broker.Topology, error) {
	return service.ToolBroker(ctx, a.cfg, "sasctl-bench", a.logger, inputs...)
}
