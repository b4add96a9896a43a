package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"sas/internal/harness/localstack"
	"sas/internal/statestore/lab"
)

// The cost ledger: what an order costs each process, and what it costs
// in the units the servers work in (transactions, WAL flushes, messages)
// and in wake-ups.

// brokerCounts is what one service's /metrics says it did with RabbitMQ.
type brokerCounts struct {
	published, delivered, ackFrames float64
}

// brokerCounters reads a service's broker counters from its /metrics:
// messages published (every outcome), deliveries handled and ack frames
// sent. A service that does not answer reads as zero.
func brokerCounters(ctx context.Context, addr string) (brokerCounts, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return brokerCounts{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return brokerCounts{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return brokerCounts{}, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	return parseBrokerCounters(resp.Body)
}

// parseBrokerCounters sums the broker counters of one exposition.
func parseBrokerCounters(r io.Reader) (brokerCounts, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return brokerCounts{}, fmt.Errorf("read metrics: %w", err)
	}
	sum := func(name string) float64 {
		var s float64
		if f, ok := families[name]; ok {
			for _, m := range f.GetMetric() {
				s += m.GetCounter().GetValue()
			}
		}
		return s
	}
	return brokerCounts{
		published: sum("sas_broker_published_total"),
		delivered: sum("sas_broker_consumed_total"),
		ackFrames: sum("sas_broker_ack_frames_total"),
	}, nil
}

// ledger is an order's cost in the servers' units over the window, each
// per order completed in it. The per-process CPU, wake-ups and messages
// are in the report's processes.
type ledger struct {
	// PostgreSQL, the whole cluster: transactions (commits and
	// rollbacks), WAL records, writes and flushes (fsyncs), and the
	// server's CPU per transaction.
	Transactions      float64 `json:"transactions"`
	WALRecords        float64 `json:"wal_records"`
	WALWrites         float64 `json:"wal_writes"`
	WALFlushes        float64 `json:"wal_flushes"`
	PostgresCPUPerTxn float64 `json:"postgres_cpu_ms_per_transaction,omitempty"`
	// RabbitMQ: messages published (the services' and the load
	// generator's), deliveries the services handled, ack frames they
	// sent, and the broker's CPU per message published.
	Published         float64 `json:"messages_published"`
	Delivered         float64 `json:"messages_delivered"`
	AckFrames         float64 `json:"ack_frames"`
	RabbitCPUPerMsgMS float64 `json:"rabbitmq_cpu_ms_per_message,omitempty"`
	// WakeUps: context switches of every process above, together.
	WakeUps float64 `json:"wake_ups"`
}

// fillLedger works out the ledger from the window's readings. It needs
// the processes (fill) first.
func (r *benchReport) fillLedger(w0, w1 *lab.WALReading, c0, c1 cpuSnapshot, submits int64, completions int) {
	if completions == 0 {
		return
	}
	n := float64(completions)
	l := &ledger{}
	if w0 != nil && w1 != nil {
		l.Transactions = float64(w1.Transactions-w0.Transactions) / n
		l.WALRecords = float64(w1.Records-w0.Records) / n
		l.WALWrites = float64(w1.Writes-w0.Writes) / n
		l.WALFlushes = float64(w1.Flushes-w0.Flushes) / n
	}
	l.Published = float64(submits) / n
	for i := range r.Processes {
		p := &r.Processes[i]
		b0, b1 := c0.broker[p.Name], c1.broker[p.Name]
		p.PublishedPerOrder = (b1.published - b0.published) / n
		p.DeliveredPerOrder = (b1.delivered - b0.delivered) / n
		l.Published += p.PublishedPerOrder
		l.Delivered += p.DeliveredPerOrder
		l.AckFrames += (b1.ackFrames - b0.ackFrames) / n
		l.WakeUps += p.WakeUpsPerOrder
		switch p.server {
		case "postgres":
			if l.Transactions > 0 {
				l.PostgresCPUPerTxn = p.CPUMSPerOrder / l.Transactions
			}
		case "rabbitmq":
			if l.Published > 0 {
				l.RabbitCPUPerMsgMS = p.CPUMSPerOrder / l.Published
			}
		}
	}
	r.Ledger = l
}

func (l *ledger) print(w io.Writer) {
	fmt.Fprintf(w, "\nLEDGER (per completed order)\n")
	fmt.Fprintf(w, "  postgres  %.1f transactions (%.3f ms of its CPU each); WAL %.1f records, %.1f writes, %.1f flushes\n",
		l.Transactions, l.PostgresCPUPerTxn, l.WALRecords, l.WALWrites, l.WALFlushes)
	fmt.Fprintf(w, "  rabbitmq  %.1f messages published (%.3f ms of its CPU each), %.1f delivered, %.1f ack frames\n",
		l.Published, l.RabbitCPUPerMsgMS, l.Delivered, l.AckFrames)
	fmt.Fprintf(w, "  wake-ups  %.0f context switches of every process\n", l.WakeUps)
}

// idleUse is what every process did over a window with no load: a system
// at rest should cost next to nothing and wake rarely.
type idleUse struct {
	Seconds   float64      `json:"window_s"`
	Processes []processUse `json:"processes"`
}

// measureIdle reads every process before and after d with no load.
func measureIdle(ctx context.Context, st *localstack.Stack, d time.Duration) (*idleUse, error) {
	c0 := takeCPU(ctx, st)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(d):
	}
	c1 := takeCPU(ctx, st)
	wall := c1.at.Sub(c0.at).Seconds()
	u := &idleUse{Seconds: wall}
	for _, p := range uses(st, c0, c1) {
		p.CPUSeconds, p.CPUPercent = p.d.cpu.Seconds(), 100*p.d.cpu.Seconds()/wall
		p.WakeUpsPerSecond = float64(p.d.switches) / wall
		u.Processes = append(u.Processes, p)
	}
	return u, nil
}

func (u *idleUse) print(w io.Writer) {
	fmt.Fprintf(w, "\nAT REST (%.1f s, no load)\n", u.Seconds)
	for _, p := range u.Processes {
		fmt.Fprintf(w, "  %-34s %5.2f %% of a core  %6.0f wake-ups/s\n", p.Name, p.CPUPercent, p.WakeUpsPerSecond)
	}
}
