// Package netproxy is a loopback TCP proxy to put between a process and a
// service, so that a test or a fault run can cut its connections, or
// refuse new ones for a while, as a network fault or a restart would.
package netproxy

import (
	"bytes"
	"net"
	"sync"
	"time"
)

// Proxy forwards a loopback port to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	down    bool
	latency time.Duration
	armed   [][]byte // CutOn's fragments not yet met
	cut     int      // how many of them were met
	wg      sync.WaitGroup
}

// New listens on a free loopback port and forwards to target until Close.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Close stops listening and cuts every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Sever()
	p.wg.Wait()
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Sever closes every connection going through the proxy now, as a broker
// crash or a network fault would. New connections are still accepted. It
// returns how many connections it cut.
func (p *Proxy) Sever() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
		n++
	}
	return n / 2
}

// SetDown makes the proxy refuse connections (down) or accept them again,
// as a stopped and restarted service would. Going down also severs every
// connection.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
	if down {
		p.Sever()
	}
}

// SetLatency delays every chunk of data forwarded, each way, by d (0: no
// delay), as a slow or congested network would.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// CutOn arms one cut: the first chunk a client sends through the proxy
// that holds fragment (a statement's text, say) closes that connection
// before the chunk reaches the target, as a network fault in the middle
// of that statement would. Each call arms one cut; Cuts counts those
// made.
func (p *Proxy) CutOn(fragment string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = append(p.armed, []byte(fragment))
}

// Cuts is how many of CutOn's cuts were made.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// cutHere reports whether chunk meets an armed cut, disarming it.
func (p *Proxy) cutHere(chunk []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, f := range p.armed {
		if bytes.Contains(chunk, f) {
			p.armed = append(p.armed[:i], p.armed[i+1:]...)
			p.cut++
			return true
		}
	}
	return false
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

func (p *Proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// admit tracks a connection's two sides, unless the proxy went down
// since it was accepted: the check and the tracking under one lock, so
// that a connection is either cut by SetDown's Sever or refused, never
// left through while the proxy is down.
func (p *Proxy) admit(client, server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.isDown() {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.admit(client, server) {
			client.Close()
			server.Close()
			continue
		}
		p.wg.Go(func() { p.pipe(server, client, true) })
		p.wg.Go(func() { p.pipe(client, server, false) })
	}
}

// pipe copies until either side closes (or is cut), then closes both.
// Upstream is the client's side, which CutOn's cuts watch.
func (p *Proxy) pipe(dst, src net.Conn, upstream bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if upstream && p.cutHere(buf[:n]) {
				return
			}
			if d := p.delay(); d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
