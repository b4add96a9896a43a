package workflow

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"sas/internal/messages"
)

// Inbound is a route that turns a foreign JSON event (a payment
// provider's, a repository's) posted to the API at
// /api/v1/hooks/WORKFLOW/NAME into an order of the workflow or a signal
// to one of its orders. The sender signs the body: HMAC-SHA256 under the
// secret in the API's environment variable SecretEnv, hex, in the header
// SignatureHeader after SignaturePrefix. Its mappings are CEL
// expressions over the event, which they see as payload. Its orders and
// signals are of Namespace ("": the default one) alone.
type Inbound struct {
	Name            string         `json:"name"`
	Namespace       string         `json:"namespace,omitempty"`
	SecretEnv       string         `json:"secret_env"`
	SignatureHeader string         `json:"signature_header"`
	SignaturePrefix string         `json:"signature_prefix,omitempty"`
	Start           *InboundStart  `json:"start,omitempty"`
	Signal          *InboundSignal `json:"signal,omitempty"`
}

// InboundStart makes an order of the event: Key is its idempotency key
// (the same key twice is one order), Payload its payload (a JSON object).
type InboundStart struct {
	Key     string `json:"key"`
	Payload string `json:"payload"`
	key     *Expr
	payload *Expr
}

// InboundSignal sends a signal of the event to the workflow's order its
// business key names (Where: search attribute name to CEL), as a signal
// by key does; Payload is its payload (none when "").
type InboundSignal struct {
	Name    string            `json:"name"`
	Where   map[string]string `json:"where"`
	Payload string            `json:"payload,omitempty"`
	All     bool              `json:"all,omitempty"`
	where   map[string]*Expr
	payload *Expr
}

// UseInbound is an inbound route's mapping: it sees the event as payload.
const UseInbound = "inbound"

// headerName is an HTTP header's name.
var headerName = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// MaxInbound bounds a workflow's inbound routes.
const MaxInbound = 8

// InboundRoute returns the workflow's inbound route named name.
func (wf Workflow) InboundRoute(name string) (Inbound, bool) {
	for _, in := range wf.Inbound {
		if in.Name == name {
			return in, true
		}
	}
	return Inbound{}, false
}

// StartOf maps an event to the order it starts: its idempotency key and
// payload.
func (s *InboundStart) StartOf(event []byte) (key string, payload []byte, err error) {
	ctx, cancel := submitBudget()
	defer cancel()
	act, err := Vars{Payload: event}.activation(UseInbound)
	if err != nil {
		return "", nil, err
	}
	k, err := s.key.evalIn(ctx, act)
	if err != nil {
		return "", nil, fmt.Errorf("key %q: %s", s.Key, err)
	}
	kv, ok := ConvertAttr(AttrString, k.Value())
	if !ok || kv.(string) == "" {
		return "", nil, fmt.Errorf("key %q yields no text", s.Key)
	}
	p, err := s.payload.evalIn(ctx, act)
	if err != nil {
		return "", nil, fmt.Errorf("payload %q: %s", s.Payload, err)
	}
	raw, err := compactJSON(toJSON(p))
	if err != nil || len(raw) == 0 || raw[0] != '{' {
		return "", nil, fmt.Errorf("payload %q yields no JSON object", s.Payload)
	}
	return kv.(string), raw, nil
}

// SignalOf maps an event to its signal's business key and payload.
func (s *InboundSignal) SignalOf(event []byte) (where map[string]any, payload json.RawMessage, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), SubmitExprTime)
	defer cancel()
	act, err := Vars{Payload: event}.activation(UseInbound)
	if err != nil {
		return nil, nil, err
	}
	where = map[string]any{}
	for name, e := range s.where {
		v, err := e.evalIn(ctx, act)
		if err != nil {
			return nil, nil, fmt.Errorf("where.%s %q: %s", name, e.Text, err)
		}
		switch x := v.Value().(type) {
		case string, bool, float64:
			where[name] = x
		case int64:
			where[name] = float64(x)
		case uint64:
			where[name] = float64(x)
		default:
			return nil, nil, fmt.Errorf("where.%s %q yields %s, not a string, number or boolean", name, e.Text, v.Type().TypeName())
		}
	}
	if s.payload != nil {
		v, err := s.payload.evalIn(ctx, act)
		if err != nil {
			return nil, nil, fmt.Errorf("payload %q: %s", s.Payload, err)
		}
		if payload, err = compactJSON(toJSON(v)); err != nil {
			return nil, nil, fmt.Errorf("payload %q: %s", s.Payload, err)
		}
	}
	return where, payload, nil
}

func (p *parser) inbound(n *yaml.Node, wf *Workflow) []Inbound {
	if n.Kind != yaml.SequenceNode {
		p.problem(n.Line, "inbound must be a list; write \"inbound:\" then \"  - {name: payments, secret_env: PAYMENTS_HOOK_SECRET, start: {...}}\" items")
		return nil
	}
	if len(n.Content) > MaxInbound {
		p.problem(n.Line, "%d inbound routes, at most %d", len(n.Content), MaxInbound)
		return nil
	}
	var out []Inbound
	seen := map[string]int{}
	for _, item := range n.Content {
		item = deref(item)
		in := Inbound{SignatureHeader: "Sas-Signature", SignaturePrefix: "sha256="}
		before := len(p.problems)
		p.mapping(item, "an inbound route", map[string]func(*yaml.Node){
			"name": func(v *yaml.Node) { p.name(v, "inbound route name", maxNameLen, &in.Name) },
			"namespace": func(v *yaml.Node) {
				if err := messages.CheckNamespace(v.Value); err != nil {
					p.problem(v.Line, "inbound route's %v", err)
					return
				}
				in.Namespace = v.Value
			},
			"secret_env": func(v *yaml.Node) {
				if !secretEnvPattern.MatchString(v.Value) {
					p.problem(v.Line, "secret_env %q is not the name of an environment variable; write upper-case letters, digits and _ (the API's variable holding the secret, never the secret)", clipText(v.Value))
					return
				}
				in.SecretEnv = v.Value
			},
			"signature_header": func(v *yaml.Node) {
				if !headerName.MatchString(v.Value) {
					p.problem(v.Line, "signature_header %q is not a header name", clipText(v.Value))
					return
				}
				in.SignatureHeader = v.Value
			},
			"signature_prefix": func(v *yaml.Node) {
				if len(v.Value) > 32 {
					p.problem(v.Line, "signature_prefix is longer than 32 characters")
					return
				}
				in.SignaturePrefix = v.Value
			},
			"start": func(v *yaml.Node) {
				st := &InboundStart{}
				var keyNode, payloadNode *yaml.Node
				p.mapping(v, "an inbound start", map[string]func(*yaml.Node){
					"key":     func(x *yaml.Node) { keyNode = x },
					"payload": func(x *yaml.Node) { payloadNode = x },
				}, "key", "payload")
				if keyNode != nil && payloadNode != nil {
					st.key = p.expr(keyNode, UseInbound, &st.Key)
					st.payload = p.expr(payloadNode, UseInbound, &st.Payload)
					in.Start = st
				}
			},
			"signal": func(v *yaml.Node) {
				sg := &InboundSignal{Where: map[string]string{}, where: map[string]*Expr{}}
				p.mapping(v, "an inbound signal", map[string]func(*yaml.Node){
					"name": func(x *yaml.Node) { p.name(x, "signal name", 100, &sg.Name) },
					"where": func(x *yaml.Node) {
						if x.Kind != yaml.MappingNode || len(x.Content) == 0 || len(x.Content) > 16 {
							p.problem(x.Line, "where must map 1 to 8 search attributes to CEL over the event, e.g. {invoice: payload.data.invoice}")
							return
						}
						for i := 0; i+1 < len(x.Content); i += 2 {
							name, val := x.Content[i].Value, x.Content[i+1]
							if !hasAttribute(wf, name) {
								p.problem(x.Content[i].Line, "where names %q, which is not a search attribute of workflow %q", clipText(name), wf.Name)
								continue
							}
							var text string
							if e := p.expr(val, UseInbound, &text); e != nil {
								sg.Where[name], sg.where[name] = text, e
							}
						}
					},
					"payload": func(x *yaml.Node) { sg.payload = p.expr(x, UseInbound, &sg.Payload) },
					"all": func(x *yaml.Node) {
						if x.Value != "true" && x.Value != "false" {
							p.problem(x.Line, "all must be true or false")
							return
						}
						sg.All = x.Value == "true"
					},
				}, "name", "where")
				in.Signal = sg
			},
		}, "name", "secret_env")
		if len(p.problems) > before {
			continue
		}
		if (in.Start == nil) == (in.Signal == nil) {
			p.problem(item.Line, "inbound route %q must say either start (an order of the event) or signal (a signal to the order its key names)", in.Name)
			continue
		}
		if first, dup := seen[in.Name]; dup {
			p.problem(item.Line, "inbound route %q is declared twice (first at line %d)", in.Name, first)
			continue
		}
		if !wf.In(in.Namespace) {
			p.problem(item.Line, "inbound route %q acts in namespace %s, where workflow %q does not run; give the route one of %s",
				in.Name, cmp.Or(in.Namespace, defaultNamespace), wf.Name, strings.Join(wf.Namespaces, ", "))
			continue
		}
		seen[in.Name] = item.Line
		out = append(out, in)
	}
	return out
}

// hasAttribute says whether wf declares the search attribute.
func hasAttribute(wf *Workflow, name string) bool {
	for _, a := range wf.SearchAttributes {
		if a.Name == name {
			return true
		}
	}
	return false
}

// compactJSON drops the spaces of raw (protojson writes some at random).
func compactJSON(raw []byte, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
