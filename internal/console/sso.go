package console

import (
	"context"
	"net/http"
	"sync"
	"time"

	"sas/internal/oidcauth"
)

// ssoCookie binds a sign-in begun at the identity provider to the browser
// that began it: it holds the sign-in's state, which the provider's
// redirect back must carry too. It is SameSite=Lax: that redirect is a
// navigation from the provider's site, which a Strict cookie would not
// come with.
const ssoCookie = "sas_sso"

// ssoCallback is the path the provider sends the browser back to.
const ssoCallback = "/login/oidc/callback"

// ssoPendingFor is how long a begun sign-in waits for its callback.
const ssoPendingFor = 10 * time.Minute

// ssoState is a signed-in session's tokens; one refresh at a time (the
// provider may rotate the refresh token: two refreshes with one token
// would end the session).
type ssoState struct {
	mu sync.Mutex
	s  oidcauth.Session
}

// pendingSSO are the sign-ins begun and not yet back, by state; each is
// taken once, so a replayed callback finds nothing.
type pendingSSO struct {
	mu sync.Mutex
	m  map[string]pendingSignIn
}

type pendingSignIn struct {
	start oidcauth.Start
	next  string
	until time.Time
}

func (p *pendingSSO) put(st oidcauth.Start, next string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) >= maxSessions {
		for k, v := range p.m {
			if now.After(v.until) {
				delete(p.m, k)
			}
		}
		if len(p.m) >= maxSessions {
			clear(p.m)
		}
	}
	p.m[st.State] = pendingSignIn{start: st, next: next, until: now.Add(ssoPendingFor)}
}

func (p *pendingSSO) take(state string, now time.Time) (pendingSignIn, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[state]
	delete(p.m, state)
	return v, ok && now.Before(v.until)
}

func (s *server) ssoRedirect() string { return s.origins.public[0] + ssoCallback }

// ssoBegin sends the browser to the provider with a fresh state, nonce
// and PKCE challenge.
func (s *server) ssoBegin(w http.ResponseWriter, r *http.Request) {
	if s.idp == nil {
		s.notFound(w, r)
		return
	}
	st, err := s.idp.Begin(r.Context(), s.ssoRedirect())
	if err != nil {
		s.logger.Error("console sign-in: the identity provider cannot be reached", "err", err)
		s.fail(w, r, nil, http.StatusServiceUnavailable, "The identity provider cannot be reached: try again in a moment.")
		return
	}
	s.pending.put(st, safeNext(r.URL.Query().Get("next")), s.now())
	http.SetCookie(w, &http.Cookie{Name: ssoCookie, Value: st.State, Path: ssoCallback, MaxAge: int(ssoPendingFor.Seconds()),
		Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, st.URL, http.StatusSeeOther)
}

// ssoFinish is the provider's redirect back: the state must be the one
// this browser's cookie holds and one begun here and not used yet; the
// code is exchanged with the PKCE verifier, the ID token checked (keys,
// issuer, audience, expiry, nonce) and its roles mapped.
func (s *server) ssoFinish(w http.ResponseWriter, r *http.Request) {
	if s.idp == nil {
		s.notFound(w, r)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: ssoCookie, Value: "", Path: ssoCallback, MaxAge: -1,
		Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode})
	q := r.URL.Query()
	refuse := func(why string, status int, attrs ...any) {
		s.ssoLogins.WithLabelValues("refused").Inc()
		s.logger.Warn("console sign-in refused: "+why, append(attrs, "addr", clientAddr(r))...)
		s.fail(w, r, nil, status, "The sign-in failed: "+why+". Sign in again.")
	}
	if e := q.Get("error"); e != "" {
		refuse("the identity provider answered "+truncate(e, 64), http.StatusUnauthorized, "description", truncate(q.Get("error_description"), 200))
		return
	}
	state, code := q.Get("state"), q.Get("code")
	c, err := r.Cookie(ssoCookie)
	if state == "" || code == "" || err != nil || !sameToken(state, c.Value) {
		refuse("its state is missing or not this browser's", http.StatusForbidden)
		return
	}
	p, ok := s.pending.take(state, s.now())
	if !ok {
		refuse("it was not begun here, took too long or was used already", http.StatusForbidden)
		return
	}
	sess, err := s.idp.Finish(r.Context(), s.ssoRedirect(), code, p.start)
	if err != nil {
		status := http.StatusUnauthorized
		if sess.Identity.Subject != "" {
			status = http.StatusForbidden // valid, but maps to no role
		}
		refuse("the provider's answer was not accepted", status, "err", err, "subject", sess.Identity.Subject)
		return
	}
	s.ssoLogins.WithLabelValues("ok").Inc()
	t, ss := s.sessions.start(sess.Identity.Actor(), s.now())
	ss.sso = &ssoState{s: sess}
	setCookie(w, sessionCookie, t, 0)
	s.logger.Info("console sign-in", "user", sess.Identity.Actor(), "display", sess.Identity.Display, "role", sess.Identity.Role,
		"provider", sess.Identity.Issuer, "addr", clientAddr(r))
	// A page that goes on, not a redirect: the session cookie is
	// SameSite=Strict, and a redirect in a chain the provider's site
	// began would arrive without it.
	s.render(w, r, nil, http.StatusOK, "signedin.html", "Signed in", p.next)
}

// ssoIdentity is a signed-in session's identity, refreshed at the
// provider once its ID token has expired; false when the provider
// refuses (the person was signed out or disabled there, or lost every
// role): the session ends.
func (s *server) ssoIdentity(ctx context.Context, st *ssoState) (oidcauth.Identity, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s.now().Before(st.s.Identity.Expiry) {
		return st.s.Identity, true
	}
	ns, err := s.idp.Refresh(ctx, st.s)
	if err != nil {
		s.ssoLogins.WithLabelValues("ended").Inc()
		s.logger.Warn("console session ended: the identity provider did not renew it", "user", st.s.Identity.Actor(), "err", err)
		return oidcauth.Identity{}, false
	}
	s.ssoLogins.WithLabelValues("refreshed").Inc()
	st.s = ns
	return ns.Identity, true
}
