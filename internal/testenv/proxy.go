package testenv

import (
	"testing"

	"sas/internal/netproxy"
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
