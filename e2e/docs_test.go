package e2e

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"sas/internal/agent"
	"sas/internal/remote"
	"sas/internal/scheduler"
	"sas/internal/submitter"
)

// envVar is one SAS_ variable a configuration struct reads.
type envVar struct{ name, def string }

// envVars lists the variables of a configuration struct, including those
// of embedded structs.
func envVars(t reflect.Type) []envVar {
	var out []envVar
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, envVars(f.Type)...)
			continue
		}
		if name := f.Tag.Get("envconfig"); name != "" {
			out = append(out, envVar{"SAS_" + name, f.Tag.Get("default")})
		}
	}
	return out
}

// TestReadmeDocumentsEveryVariable keeps the README's configuration table
// complete: every variable a service reads has a row with its default.
func TestReadmeDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	for _, cfg := range []any{submitter.Config{}, scheduler.Config{}, agent.Config{}, remote.Config{}} {
		for _, v := range envVars(reflect.TypeOf(cfg)) {
			at := strings.Index(readme, "| `"+v.name+"` |")
			if at < 0 {
				t.Errorf("README has no configuration row for %s", v.name)
				continue
			}
			row, _, _ := strings.Cut(readme[at:], "\n")
			if v.def != "" && !strings.Contains(row, "`"+v.def+"`") {
				t.Errorf("README row for %s does not show the default %q: %s", v.name, v.def, row)
			}
		}
	}
}
