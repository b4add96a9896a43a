package console

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// origins is whom the console answers: the public origins the operator
// stated (SAS_CONSOLE_PUBLIC_URL), or, when none is stated, a loopback
// name or an IP address. A page of another site whose name was made to
// point at the console (DNS rebinding) comes with that name in its Host
// and Origin headers: it is refused before any handler runs, and a form's
// Origin must be one of the console's own.
type origins struct {
	public []string // scheme://host[:port], lower case, no default port
	hosts  map[string]bool
}

// parseOrigins reads SAS_CONSOLE_PUBLIC_URL: origins separated by commas.
func parseOrigins(s string) (origins, error) {
	o := origins{hosts: map[string]bool{}}
	for _, raw := range strings.Split(s, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return origins{}, fmt.Errorf("SAS_CONSOLE_PUBLIC_URL: %q is not an origin such as https://console.example.com or http://localhost:8080 (a scheme and a host, no path)", raw)
		}
		origin := normalOrigin(u.Scheme, u.Host)
		o.public = append(o.public, origin)
		host := strings.TrimPrefix(strings.TrimPrefix(origin, "https://"), "http://")
		o.hosts[host] = true
		if _, _, err := net.SplitHostPort(host); err != nil {
			// No port: the scheme's own, which a Host header may name.
			o.hosts[host+":"+map[string]string{"http": "80", "https": "443"}[u.Scheme]] = true
		}
	}
	if s != "" && len(o.public) == 0 {
		return origins{}, errors.New("SAS_CONSOLE_PUBLIC_URL names no origin")
	}
	return o, nil
}

// normalOrigin is scheme://host[:port] in lower case, without the
// scheme's default port: as a browser writes an Origin header.
func normalOrigin(scheme, host string) string {
	scheme, host = strings.ToLower(scheme), strings.ToLower(host)
	if h, port, err := net.SplitHostPort(host); err == nil &&
		(scheme == "http" && port == "80" || scheme == "https" && port == "443") {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	return scheme + "://" + host
}

// stated reports whether the operator stated public origins.
func (o origins) stated() bool { return len(o.public) > 0 }

// forUs reports whether a request's Host header names the console: one
// of its public origins' hosts, or, when none is stated, a loopback name
// or an IP address (a rebound name is neither).
func (o origins) forUs(r *http.Request) bool {
	host := strings.ToLower(r.Host)
	if o.stated() {
		return o.hosts[host]
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	return name == "localhost" || strings.HasSuffix(name, ".localhost") || net.ParseIP(name) != nil
}

// sameOrigin: a browser's Origin header, when sent, is the console's own:
// one of its public origins, or, when none is stated, the host the
// request was sent to.
func (o origins) sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if o.stated() {
		got := normalOrigin(u.Scheme, u.Host)
		for _, p := range o.public {
			if got == p {
				return true
			}
		}
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

// only refuses, with 421 Misdirected Request, every request that is not
// for the console.
func (o origins) only(h http.Handler, refused func(r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !o.forUs(r) {
			refused(r)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusMisdirectedRequest)
			msg := "This console answers only for its own address (a loopback name or an IP address)."
			if o.stated() {
				msg = "This console answers only for " + strings.Join(o.public, ", ") + "."
			}
			_, _ = fmt.Fprintln(w, msg, "Set SAS_CONSOLE_PUBLIC_URL to the address its users open.")
			return
		}
		h.ServeHTTP(w, r)
	})
}
