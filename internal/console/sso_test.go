package console

import (
	"fmt"
	"testing"
	"time"

	"sas/internal/oidcauth"
)

// A begun sign-in is taken once, and not after it has waited too long:
// a replayed or late callback finds nothing.
func TestPendingSignInsAreTakenOnceInTime(t *testing.T) {
	p := &pendingSSO{m: map[string]pendingSignIn{}}
	now := time.Unix(1_000_000, 0)
	p.put(oidcauth.Start{State: "s1", Nonce: "n1", Verifier: "v1"}, "/orders", now)
	got, ok := p.take("s1", now.Add(time.Minute))
	if !ok || got.start.Verifier != "v1" || got.next != "/orders" {
		t.Fatalf("take: %v %+v", ok, got)
	}
	if _, ok := p.take("s1", now.Add(time.Minute)); ok {
		t.Fatal("a sign-in was taken twice")
	}
	p.put(oidcauth.Start{State: "s2"}, "/", now)
	if _, ok := p.take("s2", now.Add(ssoPendingFor+time.Second)); ok {
		t.Fatal("a sign-in was taken after it expired")
	}
	if _, ok := p.take("unknown", now); ok {
		t.Fatal("an unknown state was taken")
	}
	// Bounded: past maxSessions the expired go first, then all.
	for i := range maxSessions + 10 {
		p.put(oidcauth.Start{State: fmt.Sprint(i)}, "/", now)
	}
	if len(p.m) > maxSessions {
		t.Fatalf("%d sign-ins kept, at most %d", len(p.m), maxSessions)
	}
}
