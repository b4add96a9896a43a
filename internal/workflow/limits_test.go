package workflow_test

import (
	"strings"
	"testing"

	"sas/internal/workflow"
)

const withLimits = `limits:
  payments:
    max_in_flight: 20
    rate: 3000/m
    burst: 10
    min_rate: 5/s
    namespaces:
      team-a: {max_in_flight: 5, rate: 10/s, burst: 2}
  stock: {max_in_flight: 4}
  refunds: {namespaces: {team-b: {max_in_flight: 1}}}
workflows:
  - name: shop
    concurrency_key: payload.tenant
    max_per_key: 3
    steps:
      - {action: pay, agent: payments, compensation: {action: refund, agent: refunds}}
  - name: plain
    steps:
      - {action: count, agent: stock}
`

// The file's limits are read by kind (rates per second), and a keyed
// workflow's key from the payload: a number as JSON, "" when the payload
// lacks it.
func TestLimitsAndKeysAreRead(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("w.yaml", []byte(withLimits))
	if err != nil {
		t.Fatal(err)
	}
	l := r.Limits()
	if got := l["payments"]; got != (workflow.Limits{MaxInFlight: 20, Rate: 50, Burst: 10, MinRate: 5}) {
		t.Fatalf("payments: %+v", got)
	}
	if got := l["stock"]; got != (workflow.Limits{MaxInFlight: 4}) {
		t.Fatalf("stock: %+v", got)
	}
	scoped := r.NamespaceLimits()
	if got := scoped["payments"]["team-a"]; got != (workflow.Limits{MaxInFlight: 5, Rate: 10, Burst: 2}) || len(scoped) != 2 {
		t.Fatalf("namespaces' limits %+v", scoped)
	}
	if got, ok := l["refunds"]; ok || scoped["refunds"]["team-b"] != (workflow.Limits{MaxInFlight: 1}) {
		t.Fatalf("refunds: the kind's %+v (%v), its namespaces' %+v; want team-b's alone", got, ok, scoped["refunds"])
	}
	if kinds := r.KeyedKinds(); strings.Join(kinds, ",") != "payments,refunds" {
		t.Fatalf("keyed kinds %v, want the shop's (its compensation's too)", kinds)
	}
	shop, _ := r.Lookup("shop")
	plain, _ := r.Lookup("plain")
	for payload, want := range map[string]string{`{"tenant":"t-1"}`: "t-1", `{"tenant":42}`: "42", `{}`: ""} {
		if k, ok := shop.Key([]byte(payload)); !ok || k != want || shop.MaxPerKey != 3 {
			t.Fatalf("key of %s: %q %v, want %q", payload, k, ok, want)
		}
	}
	if _, ok := plain.Key([]byte(`{"tenant":"t"}`)); ok {
		t.Fatal("a workflow without a concurrency_key gave a key")
	}
}

// Every mistake in limits and keys is refused at its line, saying what to
// write.
func TestBadLimitsAreRefusedAtTheirLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ desc, file, want string }{
		{"a rate without a unit", "limits:\n  p: {rate: 50/d}\n", `write a number per s, m or h`},
		{"a negative rate", "limits:\n  p: {rate: -5/s}\n", `positive number`},
		{"nothing limited", "limits:\n  p: {burst: 5}\n", `limit nothing`},
		{"a floor above the rate", "limits:\n  p: {rate: 5/s, min_rate: 10/s}\n", `above rate`},
		{"max_in_flight zero", "limits:\n  p: {max_in_flight: 0}\n", `max_in_flight "0" is not a whole number`},
		{"an unknown field", "limits:\n  p: {rate: 5/s, speed: 3}\n", `speed`},
		{"not a mapping", "limits:\n  - p\n", `must map agent kinds`},
		{"a namespace's min_rate", "limits:\n  p: {namespaces: {team-a: {rate: 5/s, min_rate: 1/s}}}\n", `min_rate`},
		{"the default namespace's", "limits:\n  p: {namespaces: {default: {max_in_flight: 2}}}\n", `default namespace has no limits of its own`},
		{"a namespace out of the rule", "limits:\n  p: {namespaces: {Team_A: {max_in_flight: 2}}}\n", `namespaces:`},
		{"a namespace limiting nothing", "limits:\n  p: {namespaces: {team-a: {burst: 2}}}\n", `limit nothing`},
		{"namespaces not a mapping", "limits:\n  p: {namespaces: [team-a]}\n", `must map namespaces`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			file := tc.file + "workflows:\n  - name: shop\n    steps:\n      - {action: pay, agent: p}\n"
			_, err := workflow.Parse("w.yaml", []byte(file))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "w.yaml:2") {
				t.Fatalf("got %v, want an error at line 2 saying %q", err, tc.want)
			}
		})
	}
	for _, tc := range []struct{ desc, keys, want string }{
		{"max_per_key alone", "    max_per_key: 3\n", `write concurrency_key`},
		{"a key reading results", "    concurrency_key: results.x\n", `does not compile`},
		{"max_per_key zero", "    concurrency_key: payload.t\n    max_per_key: 0\n", `max_per_key "0"`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			file := "workflows:\n  - name: shop\n" + tc.keys + "    steps:\n      - {action: pay, agent: p}\n"
			_, err := workflow.Parse("w.yaml", []byte(file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestALimitsShareNeverPassesTheWhole: n partitions' shares of a kind's
// limits add up to at most the limits (max_in_flight at least 1 a
// partition), and one partition's share is the whole.
func TestALimitsShareNeverPassesTheWhole(t *testing.T) {
	t.Parallel()
	whole := workflow.Limits{MaxInFlight: 20, Rate: 50, Burst: 7, MinRate: 5}
	if got := whole.Share(1); got != whole {
		t.Fatalf("one partition: %+v", got)
	}
	for n := 2; n <= 30; n++ {
		s := whole.Share(n)
		if s.Rate*float64(n) > whole.Rate+1e-9 || s.MinRate*float64(n) > whole.MinRate+1e-9 || s.MinRate > s.Rate {
			t.Fatalf("%d partitions: rate %v, min %v", n, s.Rate, s.MinRate)
		}
		if s.MaxInFlight < 1 || n <= whole.MaxInFlight && s.MaxInFlight*n > whole.MaxInFlight {
			t.Fatalf("%d partitions: max_in_flight %d", n, s.MaxInFlight)
		}
		if s.Burst < 1 || n <= whole.Burst && s.Burst*n > whole.Burst {
			t.Fatalf("%d partitions: burst %d", n, s.Burst)
		}
	}
	if s := (workflow.Limits{Rate: 10}).Share(4); s.MaxInFlight != 0 || s.Burst != 0 {
		t.Fatalf("limits not set stay unset: %+v", s)
	}
}
