package contract_test

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"sas/internal/contract"
	"sas/internal/harness/testenv"
)

// loadYAMLAsJSON reads a YAML document as the JSON value it denotes.
func loadYAMLAsJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func dig(t *testing.T, v any, path ...string) any {
	t.Helper()
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("no %s in %v", p, path)
		}
		v = m[p]
	}
	return v
}

// TestOpenAPIMatchesTheContract keeps docs/remote-service.openapi.yaml in
// step with this package: the headers it names, what each documented
// status means (Classify), and the request body's fields, with a body as
// the agent writes it valid against the documented schema.
func TestOpenAPIMatchesTheContract(t *testing.T) {
	t.Parallel()
	doc := loadYAMLAsJSON(t, "../../docs/remote-service.openapi.yaml")
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1") {
		t.Fatalf("openapi version %q, want 3.1", v)
	}
	op := dig(t, doc, "paths", "/v1/{action}", "post")
	if got := contract.DefaultPath("x"); got != "/v1/x" {
		t.Fatalf("default path %s is not the documented /v1/{action}", got)
	}
	var headers []string
	for _, p := range dig(t, op, "parameters").([]any) {
		if p.(map[string]any)["in"] == "header" {
			headers = append(headers, p.(map[string]any)["name"].(string))
		}
	}
	slices.Sort(headers)
	want := []string{contract.HeaderAttempt, contract.HeaderIdempotencyKey, contract.HeaderCompleteBy, contract.HeaderTraceparent,
		contract.HeaderStepToken}
	slices.Sort(want)
	if !slices.Equal(headers, want) {
		t.Fatalf("documented headers %v, the agent sends %v", headers, want)
	}
	responses := dig(t, op, "responses").(map[string]any)
	for _, must := range []int{200, 202, 400, 408, 409, 422, 429, 500, 503} {
		if _, ok := responses[strconv.Itoa(must)]; !ok {
			t.Errorf("status %d is not documented", must)
		}
	}
	for code, r := range responses {
		n, err := strconv.Atoi(code)
		if err != nil {
			t.Fatalf("status %q", code)
		}
		if got, want := r.(map[string]any)["x-sas-class"], contract.Classify(n).String(); got != want {
			t.Errorf("status %d is documented as %v, the agent takes it as %s", n, got, want)
		}
		if n == 202 {
			if _, ok := dig(t, r, "headers").(map[string]any)[contract.HeaderHeartbeat]; !ok {
				t.Errorf("status 202 does not document %s", contract.HeaderHeartbeat)
			}
		}
		if n == 429 || n == 503 {
			if _, ok := dig(t, r, "headers").(map[string]any)[contract.HeaderRetryAfter]; !ok {
				t.Errorf("status %d does not document %s", n, contract.HeaderRetryAfter)
			}
		}
	}

	schema := dig(t, doc, "components", "schemas", "Request").(map[string]any)
	var props, required []string
	for p := range schema["properties"].(map[string]any) {
		props = append(props, p)
	}
	for _, r := range schema["required"].([]any) {
		required = append(required, r.(string))
	}
	var fields, mandatory []string
	rt := reflect.TypeOf(contract.Request{})
	for i := range rt.NumField() {
		name, opts, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		fields = append(fields, name)
		if !strings.Contains(opts, "omitempty") {
			mandatory = append(mandatory, name)
		}
	}
	for _, s := range [][]string{props, required, fields, mandatory} {
		slices.Sort(s)
	}
	if !slices.Equal(props, fields) || !slices.Equal(required, mandatory) {
		t.Fatalf("documented fields %v (required %v), the body has %v (always %v)", props, required, fields, mandatory)
	}

	// Bodies as the agent writes them are valid by the document.
	sch := testenv.JSONSchema(t, schema, nil)
	for _, r := range []contract.Request{
		{OrderID: "3f0c1b8e-7d2a-4c55-9a61-0e6f2d9b4c11", Step: 1, Action: "a", Payload: json.RawMessage(`{"x":1}`)},
		{OrderID: "3f0c1b8e-7d2a-4c55-9a61-0e6f2d9b4c11", Step: 5, Action: "undo_b", Payload: json.RawMessage(`{}`),
			Results: json.RawMessage(`{"a":{"id":"r-1"},"b":{"id":"c-2"}}`), Undoes: "3f0c1b8e-7d2a-4c55-9a61-0e6f2d9b4c11/2/b",
			UndoneResult: json.RawMessage(`{"id":"c-2"}`)},
	} {
		body, _ := json.Marshal(r)
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s is not valid by the document: %v", body, err)
		}
	}
	// And one that breaks it is not: the schema is really checked.
	bad, _ := jsonschema.UnmarshalJSON(strings.NewReader(`{"order_id":"x","step":0,"action":"a"}`))
	if sch.Validate(bad) == nil {
		t.Fatal("a body without payload passed the documented schema")
	}
}
