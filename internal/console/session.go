package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Cookie names. The session cookie and the login form's CSRF cookie are
// Secure, HttpOnly and SameSite=Strict.
const (
	sessionCookie = "sas_session"
	loginCookie   = "sas_login"
)

// maxSessions bounds the sessions kept in memory; the oldest go first.
const maxSessions = 10000

// session is one logged-in browser. Its role is not kept: every request
// reads the user's role as the users file says now.
type session struct {
	user    string
	csrf    string
	expires time.Time
	// sso is set for a session signed in at the identity provider: its
	// role is the provider's, not the users file's.
	sso *ssoState
	// chosen is the namespace the session looks at, as the switcher set
	// it ("" until then).
	chosen atomic.Value
}

// view is the namespace the session chose to look at ("" for none).
func (s *session) view() string {
	v, _ := s.chosen.Load().(string)
	return v
}

func (s *session) setView(ns string) { s.chosen.Store(ns) }

// sessions are kept in memory: a restart of the console logs everyone
// out, and replicas need sticky sessions.
type sessions struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]*session
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, m: map[string]*session{}}
}

func token() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux
	return base64.RawURLEncoding.EncodeToString(b)
}

// start opens a session for user and returns its token.
func (s *sessions) start(user string, now time.Time) (string, *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= maxSessions {
		s.pruneLocked(now)
		var oldest string
		for k, v := range s.m {
			if oldest == "" || v.expires.Before(s.m[oldest].expires) {
				oldest = k
			}
		}
		if len(s.m) >= maxSessions {
			delete(s.m, oldest)
		}
	}
	t := token()
	ss := &session{user: user, csrf: token(), expires: now.Add(s.ttl)}
	s.m[t] = ss
	return t, ss
}

// get returns the live session of token and extends it.
func (s *sessions) get(t string, now time.Time) (*session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.m[t]
	if !ok {
		return nil, false
	}
	if now.After(ss.expires) {
		delete(s.m, t)
		return nil, false
	}
	ss.expires = now.Add(s.ttl)
	return ss, true
}

func (s *sessions) end(t string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, t)
}

func (s *sessions) pruneLocked(now time.Time) {
	for k, v := range s.m {
		if now.After(v.expires) {
			delete(s.m, k)
		}
	}
}

// sameToken compares two tokens in constant time.
func sameToken(a, b string) bool {
	return a != "" && len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func setCookie(w http.ResponseWriter, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: "/", MaxAge: maxAge,
		Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode,
	})
}

// limiter counts logins per client address and per user name: at most
// max failures within window each, after which logins from that address
// or for that name are refused until the oldest failure leaves the
// window. An attempt counts as a failure from the moment it is let
// through, before its password is checked, so that attempts made at the
// same moment cannot all pass the count; one that succeeds is taken back
// (a success does not clear the failures before it).
type limiter struct {
	max    int
	window time.Duration
	mu     sync.Mutex
	fails  map[string][]time.Time
}

func newLimiter(max int, window time.Duration) *limiter {
	return &limiter{max: max, window: window, fails: map[string][]time.Time{}}
}

func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// attempt lets a login for keys through, counted as a failure until
// settle says otherwise, or returns how long the keys must wait (and
// counts nothing).
func (l *limiter) attempt(now time.Time, keys ...string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var longest time.Duration
	for _, k := range keys {
		f := l.recentLocked(k, now)
		if len(f) >= l.max {
			longest = max(longest, f[len(f)-l.max].Add(l.window).Sub(now))
		}
	}
	if longest > 0 {
		return longest
	}
	if len(l.fails) > maxSessions {
		for k := range l.fails {
			if len(l.recentLocked(k, now)) == 0 {
				delete(l.fails, k)
			}
		}
	}
	for _, k := range keys {
		l.fails[k] = append(l.recentLocked(k, now), now)
	}
	return 0
}

// settle ends the attempt let through at now: a failure stays counted; a
// login that succeeded, or whose password was never checked, is taken
// back.
func (l *limiter) settle(now time.Time, failed bool, keys ...string) {
	if failed {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		f := l.fails[k]
		for i := len(f) - 1; i >= 0; i-- {
			if f[i].Equal(now) {
				l.fails[k] = append(f[:i:i], f[i+1:]...)
				break
			}
		}
		if len(l.fails[k]) == 0 {
			delete(l.fails, k)
		}
	}
}

func (l *limiter) recentLocked(k string, now time.Time) []time.Time {
	f := l.fails[k]
	i := 0
	for i < len(f) && now.Sub(f[i]) >= l.window {
		i++
	}
	f = f[i:]
	if len(f) == 0 {
		delete(l.fails, k)
		return nil
	}
	l.fails[k] = f
	return f
}
