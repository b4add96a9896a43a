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
	for range 20 {
		addr, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, err := strconv.Atoi(p)
		if err != nil || port >= from || port < 1024 {
			t.Fatalf("freeAddr gave %s; want a port under %d, the first ephemeral one", addr, from)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the port of %s is not free: %v", addr, err)
		}
		ln.Close()
	}
}
