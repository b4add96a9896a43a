package console

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
)

type loginForm struct {
	Next  string
	Name  string
	Error string
	CSRF  string
	// SSO names the identity provider to sign in with ("" for none);
	// Passwords: the users file has users.
	SSO       string
	Passwords bool
}

// maxNext bounds the page a login goes to afterwards.
const maxNext = 2048

// safeNext is where to go after logging in: a path of this site, never
// another. A browser reads a Location its own way: it drops tabs and
// newlines, takes a backslash for a slash, and so makes "/\t/host" or
// "/\\host" the address of another host. So the rule reads next only one
// way: printable ASCII with no backslash, parsed as a URL with no scheme,
// host or user, a path that starts with exactly one slash; and what is
// sent is that path and query written again by the parser, checked the
// same way, never the text that came in.
func safeNext(next string) string {
	if next == "" || len(next) > maxNext || !plainASCII(next) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	out := u.EscapedPath()
	if u.RawQuery != "" {
		out += "?" + u.Query().Encode()
	}
	if !strings.HasPrefix(out, "/") || strings.HasPrefix(out, "//") || !plainASCII(out) {
		return "/"
	}
	return out
}

// plainASCII: only visible ASCII characters, and no backslash.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return false
		}
	}
	return true
}

// loginPage shows the form with a fresh CSRF token, kept in a cookie of
// its own (there is no session yet): the form must send the same.
func (s *server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.current(r) != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.showLogin(w, r, http.StatusOK, loginForm{Next: safeNext(r.URL.Query().Get("next"))})
}

func (s *server) showLogin(w http.ResponseWriter, r *http.Request, status int, f loginForm) {
	f.CSRF = token()
	f.Passwords = s.cfg.UsersFile != "" || s.cfg.Users != ""
	if s.idp != nil {
		f.SSO = s.idp.Name()
	}
	setCookie(w, loginCookie, f.CSRF, 600)
	s.render(w, r, nil, status, "login.html", "Log in", f)
}

func (s *server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		s.showLogin(w, r, http.StatusBadRequest, loginForm{Error: "The form could not be read."})
		return
	}
	f := loginForm{Next: safeNext(r.PostForm.Get("next")), Name: r.PostForm.Get("name")}
	c, err := r.Cookie(loginCookie)
	if err != nil || !s.origins.sameOrigin(r) || !sameToken(r.PostForm.Get("csrf"), c.Value) {
		f.Error = "The form's security token is missing or wrong: try again."
		s.showLogin(w, r, http.StatusForbidden, f)
		return
	}
	now := s.now()
	addrKey, nameKey := "addr:"+clientAddr(r), "name:"+f.Name
	if wait := s.limiter.attempt(now, addrKey, nameKey); wait > 0 {
		secs := int(math.Ceil(wait.Seconds()))
		w.Header().Set("Retry-After", fmt.Sprint(secs))
		f.Error = fmt.Sprintf("Too many failed logins: try again in %d s.", secs)
		s.logins.WithLabelValues("refused").Inc()
		s.logger.Warn("console login refused: too many failures", "user", f.Name, "addr", clientAddr(r))
		s.showLogin(w, r, http.StatusTooManyRequests, f)
		return
	}
	if err := s.users.reload(); err != nil {
		s.logger.Error("users file", "err", err)
	}
	u, ok, err := s.users.authenticate(r.Context(), f.Name, r.PostForm.Get("password"))
	s.limiter.settle(now, err == nil && !ok, addrKey, nameKey)
	if err != nil {
		s.logins.WithLabelValues("busy").Inc()
		w.Header().Set("Retry-After", "1")
		f.Error = "The console is busy checking other logins: try again."
		s.showLogin(w, r, http.StatusServiceUnavailable, f)
		return
	}
	if !ok {
		s.logins.WithLabelValues("wrong").Inc()
		s.logger.Warn("console login failed", "user", f.Name, "addr", clientAddr(r))
		f.Error = "Wrong name or password."
		s.showLogin(w, r, http.StatusUnauthorized, f)
		return
	}
	s.logins.WithLabelValues("ok").Inc()
	t, _ := s.sessions.start(u.Name, now)
	setCookie(w, sessionCookie, t, 0)
	setCookie(w, loginCookie, "", -1)
	s.logger.Info("console login", "user", u.Name, "role", u.Role, "addr", clientAddr(r))
	http.Redirect(w, r, f.Next, http.StatusSeeOther)
}

// logout ends the session; its form carries the CSRF token too.
func (s *server) logout(w http.ResponseWriter, r *http.Request, rq *request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil || !sameToken(r.PostForm.Get("csrf"), rq.session.csrf) {
		s.fail(w, r, rq, http.StatusForbidden, "The form's security token is missing or wrong.")
		return
	}
	s.sessions.end(rq.token)
	setCookie(w, sessionCookie, "", -1)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
