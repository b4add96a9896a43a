package messages_test

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"sas/internal/messages"
)

// TestSubmitOrderSchemaMatchesDecoder keeps docs/submit-order.schema.json
// (version 2) and docs/submit-order-v1.schema.json true: their properties
// are the decoder's fields of that version, their required lists are what
// the decoder requires, and their examples are accepted.
func TestSubmitOrderSchemaMatchesDecoder(t *testing.T) {
	t.Parallel()
	checkSubmitOrderSchema(t, "../../docs/submit-order.schema.json", "customer", "items", "amount", "currency")
	checkSubmitOrderSchema(t, "../../docs/submit-order-v1.schema.json", "payload")
}

func checkSubmitOrderSchema(t *testing.T, file string, notInVersion ...string) {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
		Examples   []map[string]any           `json:"examples"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("schema is not JSON: %v", err)
	}

	var fields []string
	st := reflect.TypeOf(messages.SubmitOrder{})
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if !slices.Contains(notInVersion, name) {
			fields = append(fields, name)
		}
	}
	var props []string
	for p := range schema.Properties {
		props = append(props, p)
	}
	sort.Strings(fields)
	sort.Strings(props)
	if !reflect.DeepEqual(fields, props) {
		t.Fatalf("%s: schema properties %v, decoder fields %v", file, props, fields)
	}

	if len(schema.Examples) == 0 {
		t.Fatal("the schema has no example")
	}
	example := schema.Examples[0]
	body, _ := json.Marshal(example)
	if _, err := messages.DecodeSubmitOrder(body); err != nil {
		t.Fatalf("the schema's example is rejected: %v", err)
	}
	required := map[string]bool{}
	for _, r := range schema.Required {
		required[r] = true
	}
	for _, field := range fields {
		without := map[string]any{}
		for k, v := range example {
			if k != field {
				without[k] = v
			}
		}
		body, _ := json.Marshal(without)
		_, err := messages.DecodeSubmitOrder(body)
		de, rejected := messages.AsDecodeError(err)
		switch {
		case required[field] && (!rejected || de.Reason != messages.ReasonMissingField):
			t.Errorf("schema says %s is required, but the decoder without it says %v", field, err)
		case !required[field] && err != nil:
			t.Errorf("schema says %s is optional, but the decoder without it says %v", field, err)
		}
	}
}
