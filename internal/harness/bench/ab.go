package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/service"
	"sas/internal/statestore"
)

// freshSchema makes a new schema in the configured database and returns
// a database URL that uses it (search_path) and a function that drops
// it. A run on it starts with empty tables: no earlier run's rows, dead
// tuples or bloated indexes weigh on its figures.
func (a *Tool) freshSchema(ctx context.Context) (string, func(), error) {
	u, err := url.Parse(a.cfg.DatabaseURL)
	if err != nil {
		return "", nil, fmt.Errorf("SAS_DATABASE_URL: %w", err)
	}
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", nil, err
	}
	schema := "bench_" + time.Now().UTC().Format("20060102t150405") + "_" + hex.EncodeToString(b)
	o := a.cfg.Database(1)
	o.LockTimeout = 0
	pool, err := service.ToolPool(ctx, o)
	if err != nil {
		return "", nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		pool.Close()
		return "", nil, fmt.Errorf("create the run's schema: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := pool.Exec(dctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			fmt.Fprintf(a.stderr, "could not drop the run's schema %s: %v\n", schema, err)
		}
		pool.Close()
	}
	return u.String(), drop, nil
}

// schemaOf is a database URL's search_path.
func schemaOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Query().Get("search_path")
}

// benchStore migrates the database and opens it: with the migrations of
// the binaries that will run (binDir's sasctl, when it has one: another
// build may have other migrations), else with this build's own.
func (a *Tool) benchStore(ctx context.Context, binDir string) (*statestore.Store, *pgxpool.Pool, error) {
	other := filepath.Join(binDir, "sasctl")
	self, err := os.Executable()
	_, otherErr := os.Stat(other)
	if binDir == "" || err == nil && filepath.Dir(self) == filepath.Clean(binDir) || otherErr != nil {
		_, closeStore, err := service.MigrateAndOpen(ctx, a.cfg)
		if err != nil {
			return nil, nil, err
		}
		closeStore()
	} else {
		cmd := exec.CommandContext(ctx, other, "migrate")
		cmd.Env = append(os.Environ(), "SAS_DATABASE_URL="+a.cfg.DatabaseURL)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("%s migrate: %v\n%s", other, err, out)
		}
	}
	pool, err := service.ToolPool(ctx, a.cfg.Database(4))
	if err != nil {
		return nil, nil, err
	}
	return statestore.New(pool), pool, nil
}

// abReport is an A/B comparison: each side's runs, in the order they ran.
type abReport struct {
	A       string         `json:"a_bin"`
	B       string         `json:"b_bin"`
	ARuns   []*benchReport `json:"a"`
	BRuns   []*benchReport `json:"b"`
	Figures []abFigure     `json:"figures"`
}

// abFigure is one figure of both sides: every run's value, the means and
// their ratio B/A.
type abFigure struct {
	Name  string    `json:"name"`
	A     []float64 `json:"a"`
	B     []float64 `json:"b"`
	MeanA float64   `json:"mean_a"`
	MeanB float64   `json:"mean_b"`
	Ratio float64   `json:"ratio_b_over_a"`
}

// benchAB runs the scenario with A's binaries and B's (o.binDir, else
// sasctl's own) alternately, A B A B, each on a fresh schema and empty
// queues, so that both see the machine in the same state, and compares.
func (a *Tool) benchAB(ctx context.Context, o benchOptions, aDir string, rounds int) (*abReport, error) {
	bDir := o.binDir
	if bDir == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		bDir = filepath.Dir(self)
	}
	r := &abReport{A: aDir, B: bDir}
	o.purge = true // a run's leftovers are the next run's to clear
	for i := range rounds {
		for _, side := range []struct {
			name, dir string
			runs      *[]*benchReport
		}{{"A", aDir, &r.ARuns}, {"B", bDir, &r.BRuns}} {
			so := o
			so.binDir = side.dir
			if side.name == "B" {
				so.env = append(slices.Clone(o.env), o.envB...)
			}
			so.label = fmt.Sprintf("%s %s%d", o.label, side.name, i+1)
			fmt.Fprintf(a.stderr, "%s: %s (%s)\n", so.label, side.dir, o.wf)
			rep, err := a.runBench(ctx, so)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", so.label, err)
			}
			*side.runs = append(*side.runs, rep)
		}
	}
	r.compare()
	return r, nil
}

// abFigures names the figures an A/B compares and reads each from a
// report.
func abFigures() []struct {
	name string
	get  func(*benchReport) float64
} {
	proc := func(name string) func(*benchReport) float64 {
		return func(r *benchReport) float64 {
			for _, p := range r.Processes {
				if p.Name == name {
					return p.CPUMSPerOrder
				}
			}
			return 0
		}
	}
	services := func(r *benchReport) float64 {
		var sum float64
		for _, p := range r.Processes {
			switch p.Name {
			case "remote", "sasctl bench (load and listener)", "postgres (all processes)", "rabbitmq (all processes)":
			default:
				sum += p.CPUMSPerOrder
			}
		}
		return sum
	}
	return []struct {
		name string
		get  func(*benchReport) float64
	}{
		{"completed/s", func(r *benchReport) float64 { return r.CompletedPerSecond }},
		{"latency p50 ms", func(r *benchReport) float64 { return r.Latency.P50 }},
		{"latency p99 ms", func(r *benchReport) float64 { return r.Latency.P99 }},
		{"latency max ms", func(r *benchReport) float64 { return r.Latency.Max }},
		{"CPU ms per order (all)", func(r *benchReport) float64 { return r.CPUMSPerOrder }},
		{"  PostgreSQL", proc("postgres (all processes)")},
		{"  RabbitMQ", proc("rabbitmq (all processes)")},
		{"  sas services", services},
		{"machine busy %", func(r *benchReport) float64 { return r.MachineBusy }},
		// The machine's own speed around each run (the mean of before
		// and after): a B/A far from 1 says the machine changed between
		// the sides, not only the code.
		{"calibration ms", func(r *benchReport) float64 {
			return (r.Machine.CalibrationMS + r.Machine.CalibrationAfterMS) / 2
		}},
		{"WAL KiB per order", func(r *benchReport) float64 {
			if r.Database == nil {
				return 0
			}
			return r.Database.WALBytesPerOrder / 1024
		}},
	}
}

func (r *abReport) compare() {
	mean := func(v []float64) float64 {
		var s float64
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	for _, f := range abFigures() {
		fig := abFigure{Name: f.name}
		for _, rep := range r.ARuns {
			fig.A = append(fig.A, f.get(rep))
		}
		for _, rep := range r.BRuns {
			fig.B = append(fig.B, f.get(rep))
		}
		fig.MeanA, fig.MeanB = mean(fig.A), mean(fig.B)
		if fig.MeanA != 0 {
			fig.Ratio = fig.MeanB / fig.MeanA
		}
		r.Figures = append(r.Figures, fig)
	}
}

func (r *abReport) print(w io.Writer) {
	for i := range r.ARuns {
		r.ARuns[i].print(w)
		r.BRuns[i].print(w)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nA/B\tA = %s, B = %s, %d runs each, alternating A B\n", r.A, r.B, len(r.ARuns))
	fmt.Fprintln(tw, "figure\tA runs\tB runs\tmean A\tmean B\tB/A")
	for _, f := range r.Figures {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%.3f\n", f.Name, runs(f.A), runs(f.B), f.MeanA, f.MeanB, f.Ratio)
	}
	_ = tw.Flush()
}

func runs(v []float64) string {
	s := ""
	for i, x := range v {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.2f", x)
	}
	return s
}
