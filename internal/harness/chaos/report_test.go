package chaos

import (
	"strings"
	"testing"
)

// A report with a crash says how the crashed process's log ended, each
// line under the crash it belongs to.
func TestReportSaysWhyAProcessCrashed(t *testing.T) {
	t.Parallel()
	rep := Report{Seed: 42, Faults: map[string]int{}, DeadLettered: map[string]int{},
		Crashes:   []string{"scheduler-2: exit status 1"},
		CrashLogs: []string{`{"level":"WARN","msg":"database reachable"}` + "\n" + `{"level":"ERROR","msg":"scheduler failed","err":"store the file's limits: unexpected EOF"}`}}
	var b strings.Builder
	rep.Print(&b)
	out := b.String()
	want := "    the log of scheduler-2: exit status 1 ends:\n" +
		`      {"level":"WARN","msg":"database reachable"}` + "\n" +
		`      {"level":"ERROR","msg":"scheduler failed","err":"store the file's limits: unexpected EOF"}` + "\n"
	if !strings.Contains(out, want) {
		t.Fatalf("the report does not say how the crashed process's log ended:\n%s", out)
	}
	if rep.OK() {
		t.Fatal("a report with a crash is OK")
	}
}
