// Package orderfilter reads the words people select orders with (a
// status, a workflow, a time range, an id prefix, search attributes such
// as customer=42, a page cursor) into the state store's query: the same
// words mean the same orders in the HTTP API, its bulk jobs, the console
// and sasctl.
package orderfilter

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// MaxWhere bounds the attribute conditions of one filter.
const MaxWhere = 5

// Filter is a selection of orders in people's words: what a bulk job
// keeps to show what it chose.
type Filter struct {
	Status   string   `json:"status,omitempty"`
	Workflow string   `json:"workflow,omitempty"`
	From     string   `json:"from,omitempty"` // created at or after
	To       string   `json:"to,omitempty"`   // created before
	ID       string   `json:"id,omitempty"`   // an order id prefix
	Where    []string `json:"where,omitempty"`
	// Namespaces, when not nil, limit the filter to those namespaces'
	// orders: set by the API from the caller's token, never read from a
	// query string.
	Namespaces []string `json:"namespaces,omitempty"`
}

// FromValues reads a filter from a URL query (status, workflow, from, to,
// id, and where repeated).
func FromValues(v url.Values) Filter {
	return Filter{Status: v.Get("status"), Workflow: strings.TrimSpace(v.Get("workflow")), From: v.Get("from"), To: v.Get("to"),
		ID: strings.TrimSpace(v.Get("id")), Where: v["where"]}
}

// Values writes f as a URL query, as FromValues reads it.
func (f Filter) Values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"status": f.Status, "workflow": f.Workflow, "from": f.From, "to": f.To, "id": f.ID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for _, w := range f.Where {
		v.Add("where", w)
	}
	return v
}

// Empty reports whether f selects every order.
func (f Filter) Empty() bool {
	return f.Status == "" && f.Workflow == "" && f.From == "" && f.To == "" && f.ID == "" && len(f.Where) == 0
}

// Problems is every reason a filter cannot be read, each its own line.
type Problems []string

func (p Problems) Error() string { return strings.Join(p, "; ") }

// Query turns f into the store's query (no page: the caller sets After
// and Limit); the attributes' types come from reg's workflows. The error
// is Problems, naming every word that cannot be read.
func (f Filter) Query(reg *workflow.Registry) (statestore.OrderQuery, error) {
	var q statestore.OrderQuery
	var problems Problems
	q.Status = f.Status
	if f.Status != "" && !slices.Contains(statestore.OrderStatuses(), f.Status) {
		problems = append(problems, fmt.Sprintf("unknown status %q: want one of %s", Clip(f.Status, 40), strings.Join(statestore.OrderStatuses(), ", ")))
	}
	q.Workflow = f.Workflow
	if f.Workflow != "" {
		if err := messages.CheckName("workflow", f.Workflow); err != nil {
			problems = append(problems, err.Error())
		}
	}
	var err error
	if q.From, err = ParseWhen("from", f.From); err != nil {
		problems = append(problems, err.Error())
	}
	if q.To, err = ParseWhen("to", f.To); err != nil {
		problems = append(problems, err.Error())
	}
	if q.IDLow, q.IDHigh, err = IDRange(f.ID); err != nil {
		problems = append(problems, err.Error())
	}
	if len(f.Where) > MaxWhere {
		problems = append(problems, fmt.Sprintf("%d where conditions, at most %d", len(f.Where), MaxWhere))
	} else {
		for _, w := range f.Where {
			c, err := ParseWhere(reg, f.Workflow, w)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			q.Attrs = append(q.Attrs, c)
		}
	}
	if len(problems) > 0 {
		return statestore.OrderQuery{}, problems
	}
	if f.Namespaces != nil {
		q.Namespaces = slices.Clone(f.Namespaces)
	}
	return q, nil
}

var whereRE = regexp.MustCompile(`^\s*([a-z][a-z0-9_]{0,62})\s*(!=|<=|>=|=|<|>)\s*(.*?)\s*$`)

// ParseWhere reads a search attribute condition, NAME OP VALUE (OP one of
// = != < <= > >=), typing VALUE by the attribute's declaration in the
// workflows of reg (in workflow's alone, when given). A name no workflow
// declares, or two declare with different types, is refused.
func ParseWhere(reg *workflow.Registry, wfName, text string) (statestore.AttrCond, error) {
	m := whereRE.FindStringSubmatch(text)
	if m == nil {
		return statestore.AttrCond{}, fmt.Errorf("where %q is not NAME=VALUE (or !=, <, <=, >, >=) with a search attribute's name", Clip(text, 60))
	}
	name, op, raw := m[1], m[2], m[3]
	var typ string
	for _, wf := range reg.All() {
		if wfName != "" && wf.Name != wfName {
			continue
		}
		a, ok := wf.SearchAttribute(name)
		if !ok {
			continue
		}
		if typ != "" && typ != a.Type {
			return statestore.AttrCond{}, fmt.Errorf("search attribute %q is a %s in one workflow and a %s in another: name the workflow too", name, typ, a.Type)
		}
		typ = a.Type
	}
	if typ == "" {
		where := "no workflow declares it"
		if wfName != "" {
			where = "workflow " + wfName + " does not declare it"
		}
		return statestore.AttrCond{}, fmt.Errorf("where %q: %s is not a search attribute (%s under search_attributes)", Clip(text, 60), name, where)
	}
	var v any
	var ok bool
	switch typ {
	case workflow.AttrNumber:
		f, err := strconv.ParseFloat(raw, 64)
		v, ok = workflow.ConvertAttr(typ, f)
		ok = ok && err == nil
	case workflow.AttrBool:
		b, err := strconv.ParseBool(raw)
		v, ok = b, err == nil
	case workflow.AttrTime:
		t, err := ParseWhen(name, raw)
		v, ok = t, err == nil && !t.IsZero()
	default:
		v, ok = workflow.ConvertAttr(typ, strings.Trim(raw, `"`))
	}
	if !ok {
		return statestore.AttrCond{}, fmt.Errorf("where %q: %q is not a %s, the type of %s", Clip(text, 60), Clip(raw, 40), typ, name)
	}
	if typ == workflow.AttrBool && op != "=" && op != "!=" {
		return statestore.AttrCond{}, fmt.Errorf("where %q: %s is true or false; compare it with = or !=", Clip(text, 60), name)
	}
	return statestore.AttrCond{Op: op, Value: intake.Attribute(name, v)}, nil
}

var hexRE = regexp.MustCompile(`^[0-9a-f]*$`)

// IDRange turns an id prefix (hex digits, dashes anywhere) into the range
// of ids that start with it.
func IDRange(prefix string) (lo, hi string, err error) {
	p := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(prefix), "-", ""))
	if p == "" {
		return "", "", nil
	}
	if len(p) > 32 || !hexRE.MatchString(p) {
		return "", "", fmt.Errorf("the id prefix %q is not the start of an order id (hex digits and dashes)", Clip(prefix, 40))
	}
	return asUUID(p + strings.Repeat("0", 32-len(p))), asUUID(p + strings.Repeat("f", 32-len(p))), nil
}

func asUUID(h string) string {
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// ParseWhen reads a time as people write one: 2026-01-31T14:05 (UTC),
// a date, or RFC 3339; "" is no time.
func ParseWhen(field, v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339Nano, "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s %q is not a time: write 2026-01-31T14:05 (UTC) or RFC 3339", field, Clip(v, 40))
}

// EncodeCursor writes a page cursor; DecodeCursor reads one back,
// refusing anything it did not write.
func EncodeCursor(c *statestore.OrderCursor) string {
	if c == nil {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(c.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + c.OrderID))
}

// ErrCursor is why a cursor is refused.
var ErrCursor = errors.New("the page cursor is not one sas wrote: start from the first page")

// DecodeCursor reads a cursor EncodeCursor wrote; "" is the first page.
func DecodeCursor(s string) (*statestore.OrderCursor, error) {
	if s == "" {
		return nil, nil
	}
	if len(s) > 200 {
		return nil, ErrCursor
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, ErrCursor
	}
	at, id, ok := strings.Cut(string(raw), "|")
	canon, valid := messages.CanonicalID(id)
	if !ok || !valid || canon != strings.ToLower(id) {
		return nil, ErrCursor
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return nil, ErrCursor
	}
	return &statestore.OrderCursor{CreatedAt: t, OrderID: canon}, nil
}

// Clip shortens s for a message, marking the cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
