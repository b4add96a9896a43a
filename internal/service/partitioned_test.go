package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func writeLayout(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "partitions.yaml")
	if err := os.WriteFile(file, []byte("exchange: sas.route\npartitions:\n"+
		"  - {name: p1, queue_prefix: sas.p1., database_url_env: SAS_P1_URL}\n"+
		"  - {name: p2, queue_prefix: sas.p2., database_url_env: SAS_P2_URL}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestAPartitionsProcessChecksItsPlace: SAS_PARTITION must name a
// partition of the layout whose queue prefix is the process's own, and
// needs the layout; a process of the whole deployment needs a layout it
// can read.
func TestAPartitionsProcessChecksItsPlace(t *testing.T) {
	t.Parallel()
	file := writeLayout(t)
	cfg := func(file, name, prefix string) Common {
		c := Common{DatabaseURL: "postgres://x@127.0.0.1/sas", AMQPURL: "amqp://guest:guest@127.0.0.1:5672/", QueueType: "quorum"}
		c.PartitionsFile, c.Partition, c.QueuePrefix = file, name, prefix
		return c
	}
	if l, i, err := cfg(file, "p2", "sas.p2.").Own("sas.p2."); err != nil || l == nil || i != 1 {
		t.Fatalf("p2: %v %d %v", l, i, err)
	}
	if l, _, err := cfg("", "", "sas.").Own("sas."); err != nil || l != nil {
		t.Fatalf("no layout: %v %v", l, err)
	}
	for _, good := range []Common{cfg(file, "p1", "sas.p1."), cfg(file, "", "sas."), cfg("", "", "sas.")} {
		if err := good.Check(); err != nil {
			t.Errorf("%+v: %v", good.Partitioned, err)
		}
	}
	missing := filepath.Join(t.TempDir(), "none.yaml")
	for _, bad := range []Common{cfg(file, "p3", "sas.p3."), cfg(file, "p2", "sas."), cfg("", "p1", "sas.p1."), cfg(missing, "", "sas.")} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v: no error", bad.Partitioned)
		}
	}
}

// TestAPartitionsMetricsCarryItsName: every metric a process of one
// partition exports carries partition="NAME", its own labels kept and
// sorted; a metric that has a partition label of its own keeps it.
func TestAPartitionsMetricsCarryItsName(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sas_x_total", Help: "x"}, []string{"outcome"})
	own := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sas_y", Help: "y"}, []string{"partition"})
	reg.MustRegister(c, own)
	c.WithLabelValues("done").Add(3)
	own.WithLabelValues("p9").Set(1)
	g := labelled{g: reg, name: "partition", value: "p1"}
	want := "# HELP sas_x_total x\n# TYPE sas_x_total counter\nsas_x_total{outcome=\"done\",partition=\"p1\"} 3\n" +
		"# HELP sas_y y\n# TYPE sas_y gauge\nsas_y{partition=\"p9\"} 1\n"
	if err := testutil.GatherAndCompare(g, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
