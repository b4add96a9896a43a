package testenv

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// JSONSchema compiles a JSON Schema given as a decoded value (a part of a
// published document, such as an OpenAPI or AsyncAPI file), in draft
// (nil: 2020-12) unless its $schema names another.
func JSONSchema(t testing.TB, schema any, draft *jsonschema.Draft) *jsonschema.Schema {
	t.Helper()
	raw, err := json.Marshal(schema)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if draft != nil {
		c.DefaultDraft(draft)
	}
	if err := c.AddResource("mem:schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem:schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}
