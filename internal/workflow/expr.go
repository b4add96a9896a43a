package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// The uses of an expression in a step: each is checked for what it must
// yield and sees the variables its use has.
const (
	UseWhen    = "when"     // a bool over payload and results
	UseForEach = "for_each" // a list over payload and results
	UseInput   = "input"    // any value over payload and results
	// UseItemInput is the input of a for_each step: it also sees item and
	// index, the instance's element of the list and its position.
	UseItemInput = "item_input"
	// UseAttribute is a search attribute's value: it sees the payload only.
	UseAttribute = "search attribute"
	// UseKey is a workflow's concurrency_key: it too sees the payload
	// only.
	UseKey = "concurrency_key"
)

// exprCostLimit bounds the work of one evaluation of a step's expression
// (CEL's cost units, about one per operation): an expression over a
// payload an application sends cannot run away with a scheduler.
const exprCostLimit = 1_000_000

// submitCostLimit bounds the work of an expression evaluated at every
// submit, on every entrance (a search attribute, a concurrency key): a
// tenth of a step's, a few milliseconds.
const submitCostLimit = 100_000

// ExprTimeLimit bounds the time of one evaluation of a step's
// expression, and SubmitExprTime that of all the expressions an order is
// read by at submit, on every entrance (its search attributes and
// concurrency key). The cost limits count CEL's operations and decide
// alike on every machine (a step's limit is about 0.3 s of a core, a
// submit's expression's a few milliseconds); the clock bounds what the
// count underestimates (a long string compared in every iteration): at
// submit a few times a submit's cost, for a step far above its cost (a
// scheduler's step must not fail by the load of its machine). The
// evaluation is interrupted, every interruptCheck iterations of a
// comprehension, once its time is up.
const (
	ExprTimeLimit  = 10 * time.Second
	SubmitExprTime = 50 * time.Millisecond
	interruptCheck = 32
)

// maxExprLen bounds an expression's text.
const maxExprLen = 2000

// newEnv is the CEL environment of a use: payload and results (the
// results of the steps it needs, transitively, by action or id), and for
// an instance's input item and index. Numbers compare across int, uint
// and double, as JSON has only one kind of number.
func newEnv(use string) (*cel.Env, error) {
	opts := []cel.EnvOption{
		cel.Variable("payload", cel.MapType(cel.StringType, cel.DynType)),
		cel.CrossTypeNumericComparisons(true),
	}
	if use != UseAttribute && use != UseKey && use != UseInbound {
		opts = append(opts, cel.Variable("results", cel.MapType(cel.StringType, cel.DynType)))
	}
	if use == UseItemInput {
		opts = append(opts, cel.Variable("item", cel.DynType), cel.Variable("index", cel.IntType))
	}
	return cel.NewEnv(opts...)
}

// Expr is a compiled expression of a step.
type Expr struct {
	Text string
	Use  string
	prg  cel.Program
	// uses names the top-level variables the expression reads.
	uses map[string]bool
	// constant is the expression's value when it reads no variable.
	constant ref.Val
}

// ReadsOnly reports whether the expression reads no variable but those
// named (e.g. only "payload": it can be evaluated at submit).
func (e *Expr) ReadsOnly(names ...string) bool {
	for v := range e.uses {
		found := false
		for _, n := range names {
			found = found || v == n
		}
		if !found {
			return false
		}
	}
	return true
}

// ConstantFalse reports whether the expression is a bool that is always
// false (a step that can never run).
func (e *Expr) ConstantFalse() bool {
	return e.constant != nil && e.constant == types.False
}

// CompileExpr compiles text for use and checks the type it yields: a bool
// for when, a list for for_each. The error says what is wrong, in CEL's
// words, on one line.
func CompileExpr(text, use string) (*Expr, error) {
	if strings.TrimSpace(text) == "" {
		return nil, errors.New("the expression is empty")
	}
	if len(text) > maxExprLen {
		return nil, fmt.Errorf("the expression is %d characters, at most %d", len(text), maxExprLen)
	}
	env, err := newEnv(use)
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(text)
	if iss.Err() != nil {
		return nil, errors.New(oneLine(iss.Err().Error()))
	}
	out := ast.OutputType()
	switch use {
	case UseWhen:
		if !out.IsExactType(cel.BoolType) && !out.IsExactType(cel.DynType) {
			return nil, fmt.Errorf("the expression yields %s, not a bool", out)
		}
	case UseForEach:
		if out.Kind() != types.ListKind && !out.IsExactType(cel.DynType) {
			return nil, fmt.Errorf("the expression yields %s, not a list", out)
		}
	}
	limit := uint64(exprCostLimit)
	if use == UseAttribute || use == UseKey || use == UseInbound {
		limit = submitCostLimit
	}
	prg, err := env.Program(ast, cel.CostLimit(limit), cel.EvalOptions(cel.OptOptimize), cel.InterruptCheckFrequency(interruptCheck))
	if err != nil {
		return nil, errors.New(oneLine(err.Error()))
	}
	e := &Expr{Text: text, Use: use, prg: prg, uses: map[string]bool{}}
	for _, r := range ast.NativeRep().ReferenceMap() {
		if r.Name != "" && len(r.OverloadIDs) == 0 {
			e.uses[r.Name] = true // an identifier: a variable
		}
	}
	if len(e.uses) == 0 {
		if v, _, err := prg.Eval(map[string]any{}); err == nil {
			e.constant = v
		}
	}
	return e, nil
}

// Vars are the values an expression sees: JSON objects (payload,
// results), and for an instance its item (any JSON) and index.
type Vars struct {
	Payload []byte
	Results []byte
	Item    []byte
	Index   int
}

func (v Vars) activation(use string) (map[string]any, error) {
	act := map[string]any{"payload": map[string]any{}, "results": map[string]any{}}
	for name, raw := range map[string][]byte{"payload": v.Payload, "results": v.Results} {
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("%s is not a JSON object: %w", name, err)
		}
		act[name] = m
	}
	if use == UseItemInput {
		var item any
		if len(v.Item) > 0 {
			if err := json.Unmarshal(v.Item, &item); err != nil {
				return nil, fmt.Errorf("item is not JSON: %w", err)
			}
		}
		act["item"], act["index"] = item, int64(v.Index)
	}
	return act, nil
}

func (e *Expr) eval(v Vars) (ref.Val, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ExprTimeLimit)
	defer cancel()
	return e.evalVars(ctx, v)
}

// evalVars evaluates the expression over v until ctx ends.
func (e *Expr) evalVars(ctx context.Context, v Vars) (ref.Val, error) {
	act, err := v.activation(e.Use)
	if err != nil {
		return nil, err
	}
	out, err := e.evalIn(ctx, act)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %s", strings.TrimPrefix(e.Use, "item_"), e.Text, err)
	}
	return out, nil
}

// evalIn evaluates the expression over act until ctx ends: an evaluation
// cut short says it took too long.
func (e *Expr) evalIn(ctx context.Context, act map[string]any) (ref.Val, error) {
	out, _, err := e.prg.ContextEval(ctx, act)
	if err == nil && types.IsError(out) {
		err = out.(*types.Err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, errors.New("took longer than it may (" + budgetOf(ctx) + "): make it cheaper")
		}
		return nil, errors.New(oneLine(err.Error()))
	}
	return out, nil
}

// budgetOf says the time an evaluation had.
func budgetOf(ctx context.Context) string {
	if t, ok := ctx.Value(budgetKey{}).(time.Duration); ok {
		return t.String()
	}
	return ExprTimeLimit.String()
}

type budgetKey struct{}

// submitBudget is the context the expressions an order is read by at
// submit share: SubmitExprTime in all.
func submitBudget() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithValue(context.Background(), budgetKey{}, SubmitExprTime), SubmitExprTime)
}

// Bool evaluates a when expression.
func (e *Expr) Bool(v Vars) (bool, error) {
	out, err := e.eval(v)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("when %q yields %s, not a bool", e.Text, out.Type().TypeName())
	}
	return b, nil
}

// List evaluates a for_each expression: its elements, each as JSON.
func (e *Expr) List(v Vars) ([]json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ExprTimeLimit)
	defer cancel()
	return e.listIn(ctx, v)
}

// listIn is List until ctx ends.
func (e *Expr) listIn(ctx context.Context, v Vars) ([]json.RawMessage, error) {
	out, err := e.evalVars(ctx, v)
	if err != nil {
		return nil, err
	}
	raw, err := toJSON(out)
	if err != nil {
		return nil, fmt.Errorf("for_each %q: %w", e.Text, err)
	}
	// A list, and only a list: null (a field set to null) is no list of
	// nothing, it is a value of another type.
	var items []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, fmt.Errorf("for_each %q yields %s, not a list", e.Text, out.Type().TypeName())
	}
	return items, nil
}

// JSON evaluates an input expression: its value as JSON.
func (e *Expr) JSON(v Vars) ([]byte, error) {
	out, err := e.eval(v)
	if err != nil {
		return nil, err
	}
	raw, err := toJSON(out)
	if err != nil {
		return nil, fmt.Errorf("input %q: %w", e.Text, err)
	}
	return raw, nil
}

func toJSON(v ref.Val) ([]byte, error) {
	pv, err := v.ConvertToNative(reflect.TypeFor[*structpb.Value]())
	if err != nil {
		return nil, fmt.Errorf("its value (%s) cannot be JSON: %s", v.Type().TypeName(), oneLine(err.Error()))
	}
	return protojson.Marshal(pv.(*structpb.Value))
}

// Exprs compiles expressions once and keeps them: a scheduler evaluates
// the expressions of the steps it claims, which come with the step rows.
// At most max are kept; past that, the cache starts again.
type Exprs struct {
	mu    sync.Mutex
	max   int
	cache map[[2]string]*Expr
}

// NewExprs returns an empty cache of at most max compiled expressions.
func NewExprs(max int) *Exprs {
	return &Exprs{max: max, cache: map[[2]string]*Expr{}}
}

// Get returns text compiled for use.
func (c *Exprs) Get(text, use string) (*Expr, error) {
	k := [2]string{text, use}
	c.mu.Lock()
	e, ok := c.cache[k]
	c.mu.Unlock()
	if ok {
		return e, nil
	}
	e, err := CompileExpr(text, use)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.cache) >= c.max {
		clear(c.cache)
	}
	c.cache[k] = e
	c.mu.Unlock()
	return e, nil
}
