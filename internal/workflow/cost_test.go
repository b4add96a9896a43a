package workflow

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
)

// costCase is a schema and a payload, and whether checking the payload
// may take the validator's time.
type costCase struct {
	desc, schema, payload string
	within                bool
}

func nest(open, close, inner string, n int) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// TestCheckingAPayloadIsBounded: a schema that applies itself to the same
// value more than one way at every level of nesting (recursive anyOf,
// oneOf, allOf, if/then/else, items with contains, properties with
// patternProperties, a $dynamicRef) makes the validator's work double per
// level; such a payload (a few dozen bytes) is refused with the reason
// before the validator runs, whatever the keyword. Large payloads of
// ordinary schemas, and recursive schemas that apply themselves once per
// level, pass.
func TestCheckingAPayloadIsBounded(t *testing.T) {
	t.Parallel()
	twice := func(kw string) string {
		return `{"$defs":{"n":{"` + kw + `":[{"type":"array","items":{"$ref":"#/$defs/n"}},{"type":"array","items":{"$ref":"#/$defs/n"}}]}},` +
			`"type":"object","properties":{"a":{"$ref":"#/$defs/n"}}}`
	}
	deep := `{"a":` + nest("[", "]", "1", 24) + `}`
	var items []string
	for i := range 1000 {
		items = append(items, fmt.Sprintf(`{"sku":"S-%d","qty":%d}`, i, i+1))
	}
	order, _ := Builtin().Lookup("order")
	for _, c := range []costCase{
		{"recursive anyOf", twice("anyOf"), deep, false},
		{"recursive oneOf", twice("oneOf"), deep, false},
		{"recursive allOf", twice("allOf"), deep, false},
		{"if, then and else", `{"$defs":{"n":{"if":{"$ref":"#/$defs/n"},"then":{"$ref":"#/$defs/m"},"else":{"$ref":"#/$defs/m"}},"m":{"items":{"$ref":"#/$defs/n"}}},"properties":{"a":{"$ref":"#/$defs/m"}}}`, deep, false},
		{"items and contains", `{"$defs":{"n":{"type":"array","items":{"$ref":"#/$defs/n"},"contains":{"$ref":"#/$defs/n"}}},"properties":{"a":{"$ref":"#/$defs/n"}}}`, deep, false},
		{"prefixItems and contains", `{"$defs":{"n":{"type":"array","prefixItems":[{"$ref":"#/$defs/n"}],"contains":{"$ref":"#/$defs/n"}}},"properties":{"a":{"$ref":"#/$defs/n"}}}`, deep, false},
		{"properties and patternProperties", `{"$defs":{"n":{"type":"object","properties":{"x":{"$ref":"#/$defs/n"}},"patternProperties":{"^x":{"$ref":"#/$defs/n"}}}},"properties":{"a":{"$ref":"#/$defs/n"}}}`,
			`{"a":` + nest(`{"x":`, "}", "1", 24) + `}`, false},
		{"a $dynamicRef", `{"$defs":{"n":{"$dynamicAnchor":"t","anyOf":[{"type":"array","items":{"$dynamicRef":"#t"}},{"type":"array","items":{"$dynamicRef":"#t"}}]}},` +
			`"properties":{"a":{"$ref":"#/$defs/n"}}}`, deep, false},
		{"uniqueItems over 8,000 items", `{"properties":{"a":{"uniqueItems":true}}}`, `{"a":[` + strings.Repeat("1,", 8000) + `2]}`, true},
		{"the order schema, a thousand items", string(order.PayloadSchema), `{"customer":"c","amount":1,"currency":"EUR","items":[` + strings.Join(items, ",") + `]}`, true},
		{"a tree, once per level", `{"$defs":{"t":{"type":"object","properties":{"left":{"$ref":"#/$defs/t"},"right":{"$ref":"#/$defs/t"}}}},"$ref":"#/$defs/t"}`,
			nest(`{"left":{"right":{}},"right":`, "}", "{}", 28), true},
		{"any JSON, once per level", `{"$defs":{"j":{"anyOf":[{"type":["string","number","boolean","null"]},{"type":"array","items":{"$ref":"#/$defs/j"}},{"type":"object","additionalProperties":{"$ref":"#/$defs/j"}}]}},"$ref":"#/$defs/j"}`,
			`{"a":` + nest("[", "]", `{"b":1}`, 28) + `}`, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			sch, err := CompileSchema([]byte(c.schema))
			if err != nil {
				t.Fatal(err)
			}
			wf := Workflow{Name: "w", schema: sch}
			v, err := messages.PayloadValue([]byte(c.payload))
			if err != nil {
				t.Fatal(err)
			}
			err = wf.CheckPayloadValue(v)
			costly := err != nil && strings.Contains(err.Error(), fmt.Sprintf("would take more than %d steps", MaxSchemaSteps))
			if costly == c.within {
				t.Fatalf("a %d-byte payload: %v, want within the bound %v", len(c.payload), err, c.within)
			}
		})
	}
}

// TestACostlySchemaIsCaughtFromTheFile: the bound is set up for a schema
// read from a workflows file, and the payload is refused before the
// validator spends its time.
func TestACostlySchemaIsCaughtFromTheFile(t *testing.T) {
	t.Parallel()
	reg, err := Parse("w.yaml", []byte(badinput.CostlyWorkflow("k")))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("costly")
	v, _ := messages.PayloadValue([]byte(badinput.CostlyPayload(30)))
	var pe *PayloadError
	if err := wf.CheckPayloadValue(v); !errors.As(err, &pe) || pe.Pointer != "" || !strings.Contains(pe.Detail, "steps") {
		t.Fatalf("a payload nested 30 deep: %v", err)
	}
}
