package proc

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A process that ends before it is ready is reported with the end of its
// log, so that the reason survives the log's directory.
func TestExitDuringStartSaysWhy(t *testing.T) {
	p, err := StartCommand("early", []string{"sh", "-c", "echo 'listen tcp 127.0.0.1:1: address already in use'; exit 3"},
		t.TempDir(), "127.0.0.1:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	err = p.WaitReady(context.Background(), 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited during start") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("WaitReady: %v", err)
	}
}

func TestLogTailKeepsTheEnd(t *testing.T) {
	p, err := StartCommand("long", []string{"sh", "-c", "seq 1 5000"}, t.TempDir(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	got := p.LogTail(20)
	if !strings.HasSuffix(got, "4999\n5000") || len(got) > 20 {
		t.Fatalf("tail %q", got)
	}
}
