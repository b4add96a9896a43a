package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// fakeTokenStore knows the token "good" (an operator's) and those of
// known, and counts its lookups.
type fakeTokenStore struct {
	mu      sync.Mutex
	known   map[string]statestore.APIToken
	lookups int
	touched [][]int64
}

func (f *fakeTokenStore) APITokenOf(_ context.Context, presented string) (statestore.APIToken, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	if tok, ok := f.known[presented]; ok {
		return tok, nil
	}
	if presented != "good" {
		return statestore.APIToken{}, statestore.ErrBadToken
	}
	return statestore.APIToken{ID: 7, Name: "ci", Role: statestore.TokenOperator, Namespaces: []string{statestore.AllNamespaces}}, nil
}

func (f *fakeTokenStore) TouchAPITokens(_ context.Context, ids []int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.touched = append(f.touched, slices.Sorted(slices.Values(ids)))
	return nil
}

// TestTokensAreCheckedOnceForTheirTTL: a good token is looked up once and
// trusted until its TTL passes, then looked up again; a bad one is never
// trusted (every presentation is looked up, and refused).
func TestTokensAreCheckedOnceForTheirTTL(t *testing.T) {
	t.Parallel()
	st := &fakeTokenStore{}
	tk := newTokens(st, time.Minute, 100, 10)
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	tk.now = func() time.Time { return now }
	ctx := context.Background()
	for range 3 {
		if tok, err := tk.check(ctx, "good"); err != nil || tok.Name != "ci" {
			t.Fatalf("%+v %v", tok, err)
		}
	}
	if st.lookups != 1 {
		t.Fatalf("a good token looked up %d times within its TTL", st.lookups)
	}
	now = now.Add(time.Minute + time.Second)
	if _, err := tk.check(ctx, "good"); err != nil || st.lookups != 2 {
		t.Fatalf("past its TTL: %v, %d lookups", err, st.lookups)
	}
	for i := range 2 {
		if _, err := tk.check(ctx, "bad"); !errors.Is(err, statestore.ErrBadToken) || st.lookups != 3+i {
			t.Fatalf("a bad token: %v, %d lookups", err, st.lookups)
		}
	}
}

// TestEachTokenHasItsOwnAllowance: a token's burst is allowed, the next
// request refused with how long to wait; another token is not held back;
// the tokens used are recorded once per flush.
func TestEachTokenHasItsOwnAllowance(t *testing.T) {
	t.Parallel()
	st := &fakeTokenStore{}
	tk := newTokens(st, time.Minute, 1, 3)
	for i := range 3 {
		if ok, _ := tk.allow(1); !ok {
			t.Fatalf("request %d of a burst of 3 refused", i+1)
		}
	}
	ok, wait := tk.allow(1)
	if ok || wait <= 0 || wait > time.Second {
		t.Fatalf("past the burst: %v, wait %v", ok, wait)
	}
	if ok, _ := tk.allow(2); !ok {
		t.Fatal("another token was held back")
	}
	ctx := context.Background()
	if err := tk.flushUsed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tk.flushUsed(ctx); err != nil {
		t.Fatal(err)
	}
	if len(st.touched) != 1 || !slices.Equal(st.touched[0], []int64{1, 2}) {
		t.Fatalf("touched %v, want [1 2] once", st.touched)
	}
}

// TestBearerReadsOnlyABearerToken: the Authorization header's bearer
// token, whatever the scheme's case; anything else is no token.
func TestBearerReadsOnlyABearerToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		header, want string
		ok           bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer  abc ", "abc", true},
		{"Basic YWxpY2U6c2VjcmV0", "", false},
		{"Bearer ", "", false},
		{"Bearer", "", false},
		{"", "", false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/orders", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if got, ok := bearer(r); got != tc.want || ok != tc.ok {
			t.Fatalf("%q: %q %v, want %q %v", tc.header, got, ok, tc.want, tc.ok)
		}
	}
}

// TestProblemsAreBoundedDocuments: a problem is an RFC 9457 document with
// its kind, status, reason and Retry-After; its detail and each of its
// errors bounded, and no more than maxProblemErrors of them; a 401 says
// how to authenticate.
func TestProblemsAreBoundedDocuments(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/api/v1/orders", nil)
	errs := make([]string, maxProblemErrors+5)
	for i := range errs {
		errs[i] = strings.Repeat("e", 5000)
	}
	writeProblem(w, r, http.StatusTooManyRequests, probRateLimited, strings.Repeat("d", 10000), withReason("rate_limited"),
		withErrors(errs), retryAfter(1500*time.Millisecond))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Content-Type") != problemContentType || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	var p problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Type != problemTypePrefix+probRateLimited || p.Status != 429 || p.Reason != "rate_limited" || p.RetryAfter != 2 ||
		len(p.Detail) > messages.MaxReasonBytes || p.Instance != "/api/v1/orders" {
		t.Fatalf("problem %+v", p)
	}
	if len(p.Errors) != maxProblemErrors+1 || p.Errors[maxProblemErrors] != "and 5 more" {
		t.Fatalf("%d errors, last %q", len(p.Errors), p.Errors[len(p.Errors)-1])
	}
	for _, e := range p.Errors {
		if len(e) > messages.MaxReasonBytes {
			t.Fatalf("an error of %d bytes", len(e))
		}
	}
	w = httptest.NewRecorder()
	writeProblem(w, r, http.StatusUnauthorized, probUnauthorized, "no token")
	if w.Header().Get("WWW-Authenticate") == "" {
		t.Fatal("a 401 without WWW-Authenticate")
	}
}
