package statestore_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

// jsonFields are the JSON names of a struct type's fields, an embedded
// struct's (workflow.Join) as encoding/json promotes them.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// TestTheStoreReadsOnlyDeclaredSpecKeys: what the state store reads of a
// step's spec (its SQL functions and its Go statements) is a field that
// workflow.StepSpec declares (a wait's, of workflow.SpecWait): a key the
// Go side renamed or dropped cannot be read as NULL in silence.
func TestTheStoreReadsOnlyDeclaredSpecKeys(t *testing.T) {
	t.Parallel()
	texts := []string{statestore.FunctionsSQL()}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, string(b))
	}
	top := jsonFields(reflect.TypeFor[workflow.StepSpec]())
	wait := jsonFields(reflect.TypeFor[workflow.SpecWait]())
	// spec->'k', spec->>'k', spec ? 'k', and a wait's ->'wait'->>'k';
	// a wait read into a variable or a column (v_wait, w) is read as one.
	key := regexp.MustCompile(`\bspec\s*(?:->>?|\?)\s*'([A-Za-z0-9_]+)'(?:\s*->>?\s*'([A-Za-z0-9_]+)')?`)
	waitVar := regexp.MustCompile(`\b(?:v_wait|w)\s*->>?\s*'([A-Za-z0-9_]+)'`)
	seen := 0
	for _, text := range texts {
		for _, m := range key.FindAllStringSubmatch(text, -1) {
			seen++
			if !slices.Contains(top, m[1]) {
				t.Errorf("the store reads spec key %q, which workflow.StepSpec does not declare", m[1])
			}
			if m[2] != "" && m[1] == "wait" && !slices.Contains(wait, m[2]) {
				t.Errorf("the store reads a wait's key %q, which workflow.SpecWait does not declare", m[2])
			}
		}
	}
	for _, text := range texts {
		for _, m := range waitVar.FindAllStringSubmatch(text, -1) {
			seen++
			if !slices.Contains(wait, m[1]) {
				t.Errorf("the store reads a wait's key %q, which workflow.SpecWait does not declare", m[1])
			}
		}
	}
	if seen < 20 {
		t.Fatalf("only %d reads of a spec key found: the pattern no longer sees them", seen)
	}
}
