package testenv

import (
	"net/url"
	"testing"

	"sas/internal/harness/netproxy"
)

// NewProxy puts a loopback proxy in front of target for the test's
// duration (see netproxy).
func NewProxy(t testing.TB, target string) *netproxy.Proxy {
	t.Helper()
	p, err := netproxy.New(target)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Proxied puts a proxy in front of the host rawURL names and returns the
// URL that goes through it, with the proxy.
func Proxied(t testing.TB, rawURL string) (string, *netproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse %s: %v", rawURL, err)
	}
	p := NewProxy(t, u.Host)
	u.Host = p.Addr()
	return u.String(), p
}
