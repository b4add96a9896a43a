package workflow

import (
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Search attribute types: how a value is stored, indexed and compared.
const (
	AttrString = "string" // text, at most MaxAttrText bytes
	AttrNumber = "number" // a JSON number (a float64)
	AttrBool   = "bool"
	AttrTime   = "time" // an RFC 3339 time, or a CEL timestamp
)

// MaxAttributes bounds a workflow's search attributes; MaxAttrText a
// string value's length (a longer one is not stored).
const (
	MaxAttributes = 20
	MaxAttrText   = 256
)

var attrNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// SearchAttribute is one thing a workflow's orders can be found by: a
// name, a type, and the CEL expression over the payload that reads it.
type SearchAttribute struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Expr string `json:"expr"`

	expr *Expr
}

// AttrValue is a search attribute's value read from a payload: Value is
// a string, float64, bool or time.Time as Type says.
type AttrValue struct {
	Name  string
	Type  string
	Value any
}

// SearchAttribute returns the workflow's attribute named name.
func (wf Workflow) SearchAttribute(name string) (SearchAttribute, bool) {
	for _, a := range wf.SearchAttributes {
		if a.Name == name {
			return a, true
		}
	}
	return SearchAttribute{}, false
}

// Attributes reads the workflow's search attributes from a payload (a
// JSON object). An attribute whose expression fails on this payload (a
// field it lacks), yields a value of another type, or would take more
// than the submit's budget of time (SubmitExprTime, for every attribute
// together) is left out: search attributes describe an order, they never
// refuse one.
func (wf Workflow) Attributes(payload []byte) []AttrValue {
	if len(wf.SearchAttributes) == 0 {
		return nil
	}
	act, err := Vars{Payload: payload}.activation(UseAttribute)
	if err != nil {
		return nil
	}
	ctx, cancel := submitBudget()
	defer cancel()
	var out []AttrValue
	for _, a := range wf.SearchAttributes {
		if a.expr == nil || ctx.Err() != nil {
			continue
		}
		v, err := a.expr.evalIn(ctx, act)
		if err != nil {
			continue
		}
		if val, ok := ConvertAttr(a.Type, v.Value()); ok {
			out = append(out, AttrValue{Name: a.Name, Type: a.Type, Value: val})
		}
	}
	return out
}

// ConvertAttr converts v (a CEL value's Go form, or a value parsed from
// text) to the Go value of an attribute of type t, if it is one.
func ConvertAttr(t string, v any) (any, bool) {
	switch t {
	case AttrString:
		switch x := v.(type) {
		case string:
			// Text the store can keep: UTF-8 without NUL.
			return x, len(x) <= MaxAttrText && utf8.ValidString(x) && !strings.ContainsRune(x, 0)
		case int64, uint64, float64, bool:
			b, _ := json.Marshal(x)
			return string(b), true
		}
	case AttrNumber:
		switch x := v.(type) {
		case int64:
			return float64(x), true
		case uint64:
			return float64(x), true
		case float64:
			return x, !math.IsNaN(x) && !math.IsInf(x, 0)
		}
	case AttrBool:
		b, ok := v.(bool)
		return b, ok
	case AttrTime:
		switch x := v.(type) {
		case time.Time:
			return x, true
		case string:
			ts, err := time.Parse(time.RFC3339Nano, x)
			return ts, err == nil
		}
	}
	return nil, false
}

func (p *parser) searchAttributes(n *yaml.Node) []SearchAttribute {
	if n.Kind != yaml.SequenceNode {
		p.problem(n.Line, "search_attributes must be a list; write \"search_attributes:\" then \"  - {name: customer, type: string, expr: payload.customer}\" items")
		return nil
	}
	if len(n.Content) > MaxAttributes {
		p.problem(n.Line, "%d search attributes, at most %d", len(n.Content), MaxAttributes)
		return nil
	}
	var out []SearchAttribute
	seen := map[string]int{}
	for _, item := range n.Content {
		item = deref(item)
		var a SearchAttribute
		var exprNode *yaml.Node
		ok := p.mapping(item, "a search attribute", map[string]func(*yaml.Node){
			"name": func(v *yaml.Node) {
				if !attrNamePattern.MatchString(v.Value) {
					p.problem(v.Line, "search attribute name %q is not a name; write lower-case letters, digits and _, starting with a letter (at most 63)", v.Value)
					return
				}
				a.Name = v.Value
			},
			"type": func(v *yaml.Node) {
				switch v.Value {
				case AttrString, AttrNumber, AttrBool, AttrTime:
					a.Type = v.Value
				default:
					p.problem(v.Line, "search attribute type %q is not known; write %s, %s, %s or %s", v.Value, AttrString, AttrNumber, AttrBool, AttrTime)
				}
			},
			"expr": func(v *yaml.Node) { exprNode = v },
		}, "name", "type", "expr")
		if !ok {
			continue
		}
		if exprNode != nil {
			a.expr = p.expr(exprNode, UseAttribute, &a.Expr)
		}
		if first, dup := seen[a.Name]; dup && a.Name != "" {
			p.problem(item.Line, "search attribute %q is declared twice (first at line %d)", a.Name, first)
			continue
		}
		seen[a.Name] = item.Line
		out = append(out, a)
	}
	return out
}
