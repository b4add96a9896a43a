package main

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestDevStartsServersOnlyInPlaceOfLocalOnes: where the settings name a
// server of another machine that does not answer, sasctl dev says so and
// starts nothing; where both answer, it starts nothing either.
func TestDevStartsServersOnlyInPlaceOfLocalOnes(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	up := l.Addr().String()
	var log bytes.Buffer
	// 192.0.2.1 (TEST-NET-1) answers nobody.
	s, err := devServersUp(context.Background(), "postgres://u@192.0.2.1:5432/sas", "amqp://g:g@"+up+"/", installedBins, &log)
	if s != nil || err == nil || !strings.Contains(err.Error(), "PostgreSQL at 192.0.2.1:5432 (SAS_DATABASE_URL) does not answer; sasctl dev starts its own servers only in place of ones on this machine") {
		t.Fatalf("a remote database down: %v %v", s, err)
	}
	s, err = devServersUp(context.Background(), "postgres://u@"+up+"/sas", "amqp://g:g@"+up+"/", installedBins, &log)
	if s != nil || err != nil || log.Len() != 0 {
		t.Fatalf("both up: %v %v %q", s, err, log.String())
	}
	// Neither answers here, and neither is installed: it says what to
	// install, and starts nothing.
	none := func() (string, string, string) { return "", "", "" }
	s, err = devServersUp(context.Background(), "postgres://u@127.0.0.1:1/sas", "amqp://g:g@127.0.0.1:1/", none, &log)
	if s != nil || err == nil || !strings.Contains(err.Error(), "install PostgreSQL (initdb and postgres: the Debian package postgresql) and RabbitMQ (rabbitmq-server and Erlang's epmd: the Debian package rabbitmq-server)") {
		t.Fatalf("neither installed: %v %v", s, err)
	}
	pgOnly := func() (string, string, string) { return "/usr/lib/postgresql/15/bin", "", "" }
	if _, err = devServersUp(context.Background(), "postgres://u@"+up+"/sas", "amqp://g:g@127.0.0.1:1/", pgOnly, &log); err == nil ||
		strings.Contains(err.Error(), "PostgreSQL (") || !strings.Contains(err.Error(), "install RabbitMQ") {
		t.Fatalf("RabbitMQ not installed: %v", err)
	}
	for _, tc := range []struct {
		addr string
		want bool
	}{{"127.0.0.1:1", true}, {"localhost:1", true}, {"[::1]:1", true}, {"10.0.0.1:1", false}, {"db.example:1", false}} {
		if got := loopback(tc.addr); got != tc.want {
			t.Errorf("loopback(%s) = %v", tc.addr, got)
		}
	}
}

// TestDevServersPortsAreBelowTheEphemeralRange: the ports sasctl dev
// gives servers of its own are free, and below the range outgoing
// connections take theirs from (32768 and up on Linux), so that none can
// take one before its server listens.
func TestDevServersPortsAreBelowTheEphemeralRange(t *testing.T) {
	for range 50 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < 10000 || port >= 20000 {
			t.Fatalf("port %d, want one from 10000 to 19999", port)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", port, err)
		}
		l.Close()
	}
}
