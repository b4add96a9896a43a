package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"sas/internal/api"
)

// apiDoc is docs/api.openapi.yaml, read once, that every answer of the
// API in these tests is checked against: its status is documented for
// its path and method (or the operation's default), and its body is
// valid for the documented schema of its content type.
type apiDoc struct {
	doc      map[string]any
	compiler *jsonschema.Compiler
	paths    []docPath
	mu       sync.Mutex
	schemas  map[string]*jsonschema.Schema
}

type docPath struct {
	template string
	re       *regexp.Regexp
}

var loadAPIDoc = sync.OnceValues(func() (*apiDoc, error) {
	raw, err := os.ReadFile("../docs/api.openapi.yaml")
	if err != nil {
		return nil, err
	}
	var y any
	if err := yaml.Unmarshal(raw, &y); err != nil {
		return nil, err
	}
	b, err := json.Marshal(y)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("api.json", doc); err != nil {
		return nil, err
	}
	d := &apiDoc{doc: doc.(map[string]any), compiler: c, schemas: map[string]*jsonschema.Schema{}}
	for p := range d.doc["paths"].(map[string]any) {
		re := regexp.MustCompile("^/api/v1" + regexp.MustCompile(`\\\{[a-z]+\\\}`).ReplaceAllString(regexp.QuoteMeta(p), `[^/]+`) + "$")
		d.paths = append(d.paths, docPath{p, re})
	}
	// The most specific first: /bulk/{id}/orders before /bulk/{id}.
	sort.Slice(d.paths, func(i, j int) bool { return len(d.paths[i].template) > len(d.paths[j].template) })
	return d, nil
})

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// check checks one answer of the API against the document.
func (d *apiDoc) check(method, path string, status int, contentType string, body []byte) error {
	path, _, _ = strings.Cut(path, "?")
	var tpl string
	for _, p := range d.paths {
		if p.re.MatchString(path) {
			tpl = p.template
			break
		}
	}
	if tpl == "" || status == http.StatusMethodNotAllowed {
		// Outside the documented paths or methods: still a problem.
		if status < 400 || contentType != "application/problem+json" {
			return fmt.Errorf("%s %s: %d %s outside the document, not a problem", method, path, status, contentType)
		}
		tpl = ""
	}
	var op map[string]any
	if tpl != "" {
		op, _ = d.doc["paths"].(map[string]any)[tpl].(map[string]any)[strings.ToLower(method)].(map[string]any)
		if op == nil && status != http.StatusMethodNotAllowed {
			return fmt.Errorf("%s %s: the document has no %s for %s", method, path, method, tpl)
		}
	}
	ptr := "#/components/responses/Problem"
	if op != nil {
		responses := op["responses"].(map[string]any)
		key := strconv.Itoa(status)
		if _, ok := responses[key]; !ok {
			if status < 400 {
				return fmt.Errorf("%s %s: status %d is not documented for %s %s", method, path, status, method, tpl)
			}
			key = "default"
		}
		ptr = "#/paths/" + pointerEscape(tpl) + "/" + strings.ToLower(method) + "/responses/" + key
		if ref, ok := responses[key].(map[string]any)["$ref"].(string); ok {
			ptr = ref
		}
	}
	mt, _, _ := strings.Cut(contentType, ";")
	if mt == "text/event-stream" {
		return nil
	}
	schemaPtr := ptr + "/content/" + pointerEscape(mt) + "/schema"
	d.mu.Lock()
	s, ok := d.schemas[schemaPtr]
	var err error
	if !ok {
		s, err = d.compiler.Compile("api.json" + schemaPtr)
		d.schemas[schemaPtr] = s
	}
	d.mu.Unlock()
	if err != nil || s == nil {
		return fmt.Errorf("%s %s: %d answered as %s, which the document does not give there (%s): %v", method, path, status, mt, schemaPtr, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s %s: %d: the body is not JSON: %v: %s", method, path, status, err, body)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s %s: %d: the body breaks the documented schema: %v\n%s", method, path, status, err, body)
	}
	return nil
}

// TestAPIDocumentNamesEveryRoute: every route the API serves is in
// docs/api.openapi.yaml, and the document has no path or method the API
// does not serve.
func TestAPIDocumentNamesEveryRoute(t *testing.T) {
	t.Parallel()
	d, err := loadAPIDoc()
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for p, item := range d.doc["paths"].(map[string]any) {
		for m := range item.(map[string]any) {
			if m != "parameters" {
				documented = append(documented, strings.ToUpper(m)+" "+p)
			}
		}
	}
	sort.Strings(documented)
	if served := api.Endpoints(); !slices.Equal(served, documented) {
		t.Fatalf("the API serves\n  %s\nthe document names\n  %s", strings.Join(served, "\n  "), strings.Join(documented, "\n  "))
	}
}
