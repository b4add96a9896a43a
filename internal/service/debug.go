package service

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Debugged is a configuration that may name a debug address.
type Debugged interface{ DebugAddress() string }

// DebugAddress implements Debugged.
func (c Common) DebugAddress() string { return c.DebugAddr }

// ListenDebug serves Go's profiler (/debug/pprof/) on addr until the
// function it returns is called, which stops the server and waits for it.
// It is meant for a loopback or otherwise private address: profiles show
// the program's insides and a CPU profile costs CPU while it runs.
func ListenDebug(addr string, logger *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug listener on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("debug server stopped", "err", err)
		}
	}()
	logger.Warn("profiler listening; keep this address private", "addr", ln.Addr().String())
	return func() {
		_ = srv.Close()
		<-served
	}, nil
}
