package statestore_test

import (
	"bytes"
	"encoding/json"
	"math/big"
	"testing"
	"time"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// TestStoreKeepsWhatCheckResultAccepts: every answer messages.CheckResult
// (what an agent checks a service's answer with) accepts is kept by the
// state store as its step's result, and comes back in the next step's
// request, which an agent's decoder reads; every answer the store itself
// cannot keep (PostgreSQL refuses it as jsonb) is one CheckResult refuses.
func TestStoreKeepsWhatCheckResultAccepts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	for _, a := range badinput.Answers() {
		checked := messages.CheckResult(a.Body, messages.MaxResultBytes)
		var pgErr error
		var rendered string
		pgErr = b.pool.QueryRow(ctx, `SELECT $1::text::jsonb::text`, string(a.Body)).Scan(&rendered)
		if pgErr != nil && checked == nil {
			t.Errorf("%s: the store refuses it (%v), CheckResult accepts it", a.Name, pgErr)
		}
		if checked != nil {
			continue
		}
		o := order(2, time.Hour, 3)
		insert(t, b, o)
		if _, err := b.store.ClaimPending(ctx, "s", 10, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 1, OK: true, Result: a.Body, Actor: "s"}); err != nil {
			t.Fatalf("%s: the store does not keep it: %v", a.Name, err)
		}
		claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
		if err != nil || len(claimed) != 1 {
			t.Fatalf("%s: claim of step 2: %v %v", a.Name, claimed, err)
		}
		c := claimed[0]
		req, err := messages.Encode(messages.StepRequest{SchemaVersion: messages.StepRequestVersion, OrderID: c.OrderID, Step: c.Step,
			Name: c.Name, Agent: c.Agent, Attempt: c.Attempt, IdempotencyKey: c.IdempotencyKey, CompleteBy: c.CompleteBy.UTC(),
			Payload: c.Payload, Results: c.Results})
		if err == nil {
			_, err = messages.DecodeStepRequest(req)
		}
		if err != nil {
			t.Fatalf("%s: the next request does not carry it: %v", a.Name, err)
		}
		var results map[string]json.RawMessage
		if err := json.Unmarshal(c.Results, &results); err != nil || !sameJSON(t, results["step1"], a.Body) {
			t.Fatalf("%s: the next request carries %s", a.Name, c.Results)
		}
	}
}

// sameJSON: a and b are the same JSON value, numbers compared exactly
// (the store writes them out in full).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	norm := func(raw []byte) (string, bool) {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return "", false
		}
		var exact func(any) any
		exact = func(v any) any {
			switch v := v.(type) {
			case json.Number:
				r, ok := new(big.Rat).SetString(string(v))
				if !ok {
					return "not a number: " + string(v)
				}
				return r.RatString()
			case map[string]any:
				for k, e := range v {
					v[k] = exact(e)
				}
			case []any:
				for i, e := range v {
					v[i] = exact(e)
				}
			}
			return v
		}
		out, err := json.Marshal(exact(v))
		return string(out), err == nil
	}
	na, oka := norm(a)
	nb, okb := norm(b)
	return oka && okb && na == nb
}
