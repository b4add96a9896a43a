package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"sas/internal/intake"
	"sas/internal/oidcauth"
	"sas/internal/orderfilter"
	"sas/internal/statestore"
)

// caller is the token a request came with.
type caller struct {
	token statestore.APIToken
}

// actor is how the history and the operator actions name the caller.
func (c caller) actor() string { return "api:" + c.token.Name }

// scoped reports whether the caller acts in some namespaces only.
func (c caller) scoped() bool { return !c.token.In(statestore.AllNamespaces) }

// namespaces are the namespaces the caller acts in, nil for every one.
func (c caller) namespaces() []string {
	if !c.scoped() {
		return nil
	}
	return slices.Clone(c.token.Namespaces)
}

// may reports whether the caller's role is one of roles.
func (c caller) may(roles ...string) bool { return slices.Contains(roles, c.token.Role) }

// oidcRoles are the roles an identity provider's claim may map to, from
// the least to the most: of several, the last wins.
var oidcRoles = []string{statestore.TokenSubmitter, statestore.TokenViewer, statestore.TokenOperator}

// accessToken checks an identity provider's access token. Refused, it
// returns the status to answer with and why (logged without the token):
// 401 when the token is not valid, 403 when it is but maps to no role
// (in the namespace the request names, when it names one); an error and
// no status when the provider cannot be reached. The caller it makes is
// named by the provider and the subject, and has an allowance of its
// own. Its role is the one it holds in the namespace the request names
// (Sas-Namespace); naming none, its highest, in the namespaces where it
// holds that one.
func (s *server) accessToken(r *http.Request, presented string) (statestore.APIToken, int, error) {
	id, err := s.idp.VerifyAccess(r.Context(), presented)
	if errors.Is(err, oidcauth.ErrUnavailable) {
		return statestore.APIToken{}, 0, err
	}
	if err != nil {
		s.logger.Warn("api: access token refused", "err", err, "subject", id.Subject, "addr", clientHost(r))
		if errors.Is(err, oidcauth.ErrNoRole) {
			return statestore.APIToken{}, http.StatusForbidden, err
		}
		return statestore.APIToken{}, http.StatusUnauthorized, err
	}
	h := fnv.New64a()
	h.Write([]byte(id.Actor()))
	tok := statestore.APIToken{ID: -int64(h.Sum64()>>1) - 1, Name: id.Actor(), Role: id.Role, Namespaces: id.Highest()}
	if ns := requestNamespace(r); ns != "" {
		if tok.Role = id.RoleIn(ns); tok.Role == "" {
			err := fmt.Errorf("the roles claim grants no role in namespace %q", orderfilter.Clip(ns, 63))
			s.logger.Warn("api: access token refused", "err", err, "subject", id.Subject, "addr", clientHost(r))
			return statestore.APIToken{}, http.StatusForbidden, err
		}
		tok.Namespaces = []string{ns}
	}
	return tok, 0, nil
}

// requestNamespace is the namespace a request names (Sas-Namespace), ""
// for none.
func requestNamespace(r *http.Request) string {
	return strings.TrimSpace(r.Header.Get("Sas-Namespace"))
}

// rateBuckets knows, for a namespace whose submit rate's bucket was
// found empty, until when it stays so: nothing but time (or an operator
// setting the quotas) refills it, on any replica, so a submit before then
// is refused without the transaction that would find it empty again.
type rateBuckets struct {
	mu    sync.Mutex
	empty map[string]emptyBucket
}

// emptyBucket: refused here until known (at most intake.NamespacesFor
// on: an operator who sets the quotas fills the bucket, and every
// replica must know it as soon as it knows the new quotas); the bucket
// has room again at refill.
type emptyBucket struct{ known, refill time.Time }

// rateEmpty reports whether namespace ns's submit rate's bucket is known
// to be empty, and how long until it has room.
func (s *server) rateEmpty(ns string) (bool, time.Duration) {
	b := &s.buckets
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.empty[ns]
	now := time.Now()
	return ok && now.Before(e.known), e.refill.Sub(now)
}

// noteRateEmpty notes that namespace ns's bucket has no room for d.
func (s *server) noteRateEmpty(ns string, d time.Duration) {
	b := &s.buckets
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.empty == nil {
		b.empty = map[string]emptyBucket{}
	}
	now := time.Now()
	b.empty[ns] = emptyBucket{known: now.Add(min(d, intake.NamespacesFor)), refill: now.Add(d)}
}

// coversAll reports whether the caller acts in every namespace there is:
// a token of '*', or one granted each namespace (in a deployment that
// has only the default one, a token of the default namespace).
func (s *server) coversAll(ctx context.Context, c caller) (bool, error) {
	if !c.scoped() {
		return true, nil
	}
	names, err := s.namespaces.Names(ctx, false)
	if err != nil {
		return false, err
	}
	for _, ns := range names {
		if !c.token.In(ns) {
			return false, nil
		}
	}
	return true, nil
}

// tokenStore is what tokens needs of the state store.
type tokenStore interface {
	APITokenOf(ctx context.Context, presented string) (statestore.APIToken, error)
	TouchAPITokens(ctx context.Context, ids []int64) error
}

// tokens checks tokens against the store, trusting a checked one for
// ttl, limits each token's rate, and notes which were used for the
// store's last_used_at.
type tokens struct {
	store tokenStore
	ttl   time.Duration
	now   func() time.Time
	rate  rate.Limit
	burst int

	mu       sync.Mutex
	checked  map[[32]byte]checkedToken
	limiters map[int64]*rate.Limiter
	used     map[int64]bool
}

type checkedToken struct {
	token statestore.APIToken
	until time.Time
}

func newTokens(store tokenStore, ttl time.Duration, perSecond float64, burst int) *tokens {
	return &tokens{store: store, ttl: ttl, now: time.Now, rate: rate.Limit(perSecond), burst: burst,
		checked: map[[32]byte]checkedToken{}, limiters: map[int64]*rate.Limiter{}, used: map[int64]bool{}}
}

// maxCachedTokens bounds the cache: past it, it starts again.
const maxCachedTokens = 10000

// check returns the token a client presented, or statestore.ErrBadToken.
func (t *tokens) check(ctx context.Context, presented string) (statestore.APIToken, error) {
	key := sha256.Sum256([]byte(presented))
	now := t.now()
	t.mu.Lock()
	c, ok := t.checked[key]
	t.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.token, nil
	}
	tok, err := t.store.APITokenOf(ctx, presented)
	if err != nil {
		return statestore.APIToken{}, err
	}
	t.mu.Lock()
	if len(t.checked) >= maxCachedTokens {
		clear(t.checked)
	}
	t.checked[key] = checkedToken{tok, now.Add(t.ttl)}
	t.mu.Unlock()
	return tok, nil
}

// allow takes one request from the token's allowance; false and how long
// to wait when it has none.
func (t *tokens) allow(id int64) (bool, time.Duration) {
	t.mu.Lock()
	l, ok := t.limiters[id]
	if !ok {
		if len(t.limiters) >= maxCachedTokens {
			clear(t.limiters)
		}
		l = rate.NewLimiter(t.rate, t.burst)
		t.limiters[id] = l
	}
	t.used[id] = true
	t.mu.Unlock()
	r := l.Reserve()
	if d := r.Delay(); d > 0 {
		r.Cancel()
		return false, d
	}
	return true, 0
}

// flushUsed records the tokens used since the last flush.
func (t *tokens) flushUsed(ctx context.Context) error {
	t.mu.Lock()
	ids := make([]int64, 0, len(t.used))
	for id := range t.used {
		ids = append(ids, id)
	}
	clear(t.used)
	t.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	return t.store.TouchAPITokens(ctx, ids)
}

// bearer reads the Authorization header's bearer token.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// errChannelClosed: the broker channel closed without saying why.
var errChannelClosed = errors.New("the channel closed")
