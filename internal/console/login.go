package console

import (
	"fmt"
	"math"
	"net/http"
	"strings"
)

type loginForm struct {
	Next  string
	Name  string
	Error string
	CSRF  string
}

// safeNext is where to go after logging in: a path of this site, never
// another site ("//host" or a scheme).
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.ContainsAny(next, "\r\n") {
		return "/"
	}
	return next
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
	if err != nil || !sameOrigin(r) || !sameToken(r.PostForm.Get("csrf"), c.Value) {
		f.Error = "The form's security token is missing or wrong: try again."
		s.showLogin(w, r, http.StatusForbidden, f)
		return
	}
	now := s.now()
	addrKey, nameKey := "addr:"+clientAddr(r), "name:"+f.Name
	if wait := s.limiter.wait(now, addrKey, nameKey); wait > 0 {
		secs := int(math.Ceil(wait.Seconds()))
		w.Header().Set("Retry-After", fmt.Sprint(secs))
		f.Error = fmt.Sprintf("Too many failed logins: try again in %d s.", secs)
		s.logger.Warn("console login refused: too many failures", "user", f.Name, "addr", clientAddr(r))
		s.showLogin(w, r, http.StatusTooManyRequests, f)
		return
	}
	if err := s.users.reload(); err != nil {
		s.logger.Error("users file", "err", err)
	}
	u, ok := s.users.authenticate(f.Name, r.PostForm.Get("password"))
	if !ok {
		s.limiter.fail(now, addrKey, nameKey)
		s.logger.Warn("console login failed", "user", f.Name, "addr", clientAddr(r))
		f.Error = "Wrong name or password."
		s.showLogin(w, r, http.StatusUnauthorized, f)
		return
	}
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
