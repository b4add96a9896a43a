package workflow_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sas/internal/workflow"
)

// TestJoinRules: what a join says of a step's needs, the one answer every
// reader (the check, sasctl, the console, the checker) uses.
func TestJoinRules(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		join            workflow.Join
		needs           int
		quorum          string
		required, spare int
		spec            string
	}{
		{join: workflow.Join{}, needs: 0, quorum: "", required: 0, spare: 0, spec: `{}`},
		{join: workflow.Join{}, needs: 3, quorum: "", required: 3, spare: 0, spec: `{}`},
		{join: workflow.Join{Any: 2}, needs: 3, quorum: "any 2", required: 2, spare: 1, spec: `{"needs_any":2}`},
		{join: workflow.Join{Any: 1}, needs: 4, quorum: "any 1", required: 1, spare: 3, spec: `{"needs_any":1}`},
		// Any no fewer than the needs (the check refuses it in a file)
		// waits for every one and spares none.
		{join: workflow.Join{Any: 5}, needs: 3, quorum: "any 5", required: 3, spare: 0, spec: `{"needs_any":5}`},
	} {
		if got := c.join.Quorum(); got != c.quorum {
			t.Errorf("%+v Quorum = %q, want %q", c.join, got, c.quorum)
		}
		if got := c.join.Required(c.needs); got != c.required {
			t.Errorf("%+v Required(%d) = %d, want %d", c.join, c.needs, got, c.required)
		}
		if got := c.join.Spare(c.needs); got != c.spare {
			t.Errorf("%+v Spare(%d) = %d, want %d", c.join, c.needs, got, c.spare)
		}
		// Its keys are a step spec's as they always were: rows written
		// before the rule had a type read the same.
		b, err := json.Marshal(workflow.StepSpec{Join: c.join})
		if err != nil || string(b) != c.spec {
			t.Errorf("%+v in a spec = %s (%v), want %s", c.join, b, err, c.spec)
		}
		var back workflow.StepSpec
		if err := json.Unmarshal([]byte(c.spec), &back); err != nil || back.Join != c.join {
			t.Errorf("spec %s read back as %+v (%v), want %+v", c.spec, back.Join, err, c.join)
		}
	}
}

// TestOnlyTheJoinReadsItsRule: no production file but join.go reads a
// join's fields (Join.Any, not a method called Any) or names its key
// (needs_any, in Go or a template): the rest ask its methods, so a join of
// another kind is written in join.go and the store's SQL alone.
func TestOnlyTheJoinReadsItsRule(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	// In a template a method is called without parentheses (.File.Any):
	// there only the key is looked for.
	field, key := regexp.MustCompile(`\.Any\b[^(]|needs_any`), regexp.MustCompile(`needs_any`)
	seen := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "e2e", "bench", "bin", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, "_test.go") || (!strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".html")) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		seen++
		for i, line := range strings.Split(string(b), "\n") {
			re := field
			if strings.HasSuffix(path, ".html") {
				re = key
			}
			if re.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "//") && filepath.Base(path) != "join.go" {
				t.Errorf("%s:%d reads a join's rule by hand (ask workflow.Join's methods): %s", path, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 100 {
		t.Fatalf("only %d files read: the walk no longer sees the module", seen)
	}
}
