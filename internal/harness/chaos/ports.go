package chaos

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"syscall"
)

// ports picks the loopback ports of a run's services. A service killed by
// a fault starts again on the same address, so each port is taken below
// the kernel's range of ephemeral ports (an outgoing connection of any
// process here takes its local port from that range and, taking a dead
// service's, would keep it from coming back), and is held for the run by
// an advisory lock (flock) on a file of its own in the system's temporary
// folder: a port is free when picked, but not yet bound, and another run
// starting at the same moment, in this process or another, would
// otherwise pick it too (two did: one's agent could not come back for
// 10 s). The lock goes when the run releases it or its process ends.
type ports struct {
	dir  string // of the lock files; "": sas-chaos-ports in the temporary folder
	held []*os.File
}

// free returns a loopback address whose port is free now and held for the
// run.
func (p *ports) free() (string, error) {
	const lowest = 20000
	if top := ephemeralPortsFrom(); top-lowest >= 1000 {
		for range 200 {
			port := lowest + rand.IntN(top-lowest)
			lock, ok := holdPort(p.lockDir(), port)
			if !ok {
				continue // another run holds it
			}
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				if lock != nil {
					lock.Close()
				}
				continue
			}
			addr := ln.Addr().String()
			ln.Close()
			if lock != nil {
				p.held = append(p.held, lock)
			}
			return addr, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// release lets the run's ports go.
func (p *ports) release() {
	for _, f := range p.held {
		f.Close()
	}
	p.held = nil
}

func (p *ports) lockDir() string {
	if p.dir != "" {
		return p.dir
	}
	return filepath.Join(os.TempDir(), "sas-chaos-ports")
}

// holdPort locks the file of a port in dir; false when another run holds
// it. Where the file cannot be made (a folder another user owns) it
// returns nil and true: the port is then used unheld, as before there
// were locks.
func holdPort(dir string, port int) (*os.File, bool) {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, true
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%d.lock", port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}
