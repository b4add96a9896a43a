package statestore

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Attribute is one search attribute of an order: exactly one of its
// values is set, by the attribute's declared type.
type Attribute struct {
	Name string
	Text *string
	Num  *float64
	Bool *bool
	Time *time.Time
}

// Value is the attribute's value.
func (a Attribute) Value() any {
	switch {
	case a.Text != nil:
		return *a.Text
	case a.Num != nil:
		return *a.Num
	case a.Bool != nil:
		return *a.Bool
	case a.Time != nil:
		return *a.Time
	}
	return nil
}

// String is the value as a filter writes it (a time in RFC 3339, UTC).
func (a Attribute) String() string {
	switch v := a.Value().(type) {
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// column is the order_attributes column that holds a's value.
func (a Attribute) column() string {
	switch {
	case a.Num != nil:
		return "v_num"
	case a.Bool != nil:
		return "v_bool"
	case a.Time != nil:
		return "v_time"
	}
	return "v_text"
}

// AttrCond selects orders by a search attribute: Value.Name Op Value.
type AttrCond struct {
	Op    string // one of AttrOps
	Value Attribute
}

// AttrOps are the comparisons an AttrCond may make.
func AttrOps() []string { return []string{"=", "!=", "<", "<=", ">", ">="} }

func (c AttrCond) check() error {
	for _, op := range AttrOps() {
		if c.Op == op {
			if c.Value.Value() == nil {
				return fmt.Errorf("search attribute %q: no value: %w", c.Value.Name, ErrInvalidData)
			}
			if c.Value.Bool != nil && op != "=" && op != "!=" {
				return fmt.Errorf("search attribute %q is true or false: compare it with = or !=: %w", c.Value.Name, ErrInvalidData)
			}
			return nil
		}
	}
	return fmt.Errorf("search attribute %q: %q is not one of %s: %w", c.Value.Name, c.Op, strings.Join(AttrOps(), " "), ErrInvalidData)
}

// orderWhere is the filter part of a query over orders (alias o): its
// FROM (orders, or with search attributes the first one's index joined to
// orders), its conditions and their arguments, and the alias whose
// created_at and order_id give the keyset order (k: k or o). The first attribute
// condition drives the query through its index, in the orders list's
// order; the others are checked on each of its rows.
type orderWhere struct {
	from, k string
	where   []string
	args    []any
}

func (w *orderWhere) add(cond string, vals ...any) {
	for _, v := range vals {
		w.args = append(w.args, v)
		cond = strings.Replace(cond, "?", fmt.Sprintf("$%d", len(w.args)), 1)
	}
	w.where = append(w.where, cond)
}

func (w *orderWhere) sql() string {
	if len(w.where) == 0 {
		return w.from
	}
	return w.from + " WHERE " + strings.Join(w.where, " AND ")
}

// newOrderWhere builds the filter of q (not its page: After and Limit).
func newOrderWhere(q OrderQuery) (*orderWhere, error) {
	w := &orderWhere{from: "orders o"}
	k := "o"
	for i, c := range q.Attrs {
		if err := c.check(); err != nil {
			return nil, err
		}
		col := c.Value.column()
		if i == 0 && c.Op != "!=" {
			// An index range: name, then the value, then the keyset.
			w.from = "order_attributes k JOIN orders o ON o.order_id = k.order_id"
			k = "k"
			w.add("k.name = ?", c.Value.Name)
			w.add("k."+col+" "+c.Op+" ?", c.Value.Value())
			continue
		}
		w.add(fmt.Sprintf("EXISTS (SELECT 1 FROM order_attributes a WHERE a.order_id = o.order_id AND a.name = ? AND a.%s %s ?)", col, c.Op),
			c.Value.Name, c.Value.Value())
	}
	if q.Namespaces != nil {
		w.add("o.namespace = ANY(?::text[])", q.Namespaces)
	}
	if q.Status != "" {
		w.add("o.status = ?", q.Status)
	}
	if q.Workflow != "" {
		w.add("o.workflow = ?", q.Workflow)
	}
	if !q.From.IsZero() {
		w.add(k+".created_at >= ?", q.From)
	}
	if !q.To.IsZero() {
		w.add(k+".created_at < ?", q.To)
	}
	if q.IDLow != "" {
		w.add(k+".order_id >= ?::uuid", q.IDLow)
	}
	if q.IDHigh != "" {
		w.add(k+".order_id <= ?::uuid", q.IDHigh)
	}
	if q.After != nil {
		w.add(k+".created_at <= ? AND ("+k+".created_at < ? OR "+k+".order_id < ?::uuid)", q.After.CreatedAt, q.After.CreatedAt, q.After.OrderID)
	}
	w.k = k
	return w, nil
}
