package chaos

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeAddrIsBelowEphemeralPorts: the services' addresses come from
// below the kernel's ephemeral range, where no outgoing connection takes a
// port while a killed service is down.
func TestFreeAddrIsBelowEphemeralPorts(t *testing.T) {
	from := ephemeralPortsFrom()
	p := ports{dir: t.TempDir()}
	defer p.release()
	for range 20 {
		addr, err := p.free()
		if err != nil {
			t.Fatal(err)
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n >= from || n < 1024 {
			t.Fatalf("free gave %s; want a port under %d, the first ephemeral one", addr, from)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the port of %s is not free: %v", addr, err)
		}
		ln.Close()
	}
}

// TestRunsStartedTogetherPickDifferentPorts: two runs picking their
// services' ports at the same moment (none bound yet) never pick the same
// one; released, a run's ports may be picked again.
func TestRunsStartedTogetherPickDifferentPorts(t *testing.T) {
	dir := t.TempDir()
	a, b := ports{dir: dir}, ports{dir: dir}
	defer a.release() // again after the explicit release: nothing left to do then
	defer b.release()
	seen := map[string]bool{}
	for range 300 {
		addr, err := a.free()
		if err != nil {
			t.Fatal(err)
		}
		seen[addr] = true
	}
	if len(a.held) != 300 {
		t.Fatalf("a run holds %d of its 300 ports", len(a.held))
	}
	for range 300 {
		addr, err := b.free()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("two runs picked %s", addr)
		}
	}
	a.release()
	f, ok := holdPort(dir, mustPort(t, firstKey(seen)))
	if !ok {
		t.Fatal("a released port stayed held")
	}
	if f != nil {
		f.Close()
	}
}

func firstKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}

func mustPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
