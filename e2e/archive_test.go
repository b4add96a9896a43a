package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// s3Service is an S3-compatible service on a loopback port that can be
// stopped and started again on the same port, its objects kept.
type s3Service struct {
	addr    string
	handler http.Handler
	srv     *http.Server
	done    chan struct{}
}

func startS3(t *testing.T, bucket string) *s3Service {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	s := &s3Service{handler: gofakes3.New(backend).Server()}
	s.start(t, "127.0.0.1:0")
	t.Cleanup(s.stop)
	return s
}

func (s *s3Service) start(t *testing.T, addr string) {
	t.Helper()
	var ln net.Listener
	var err error
	testenv.Eventually(t, 10*time.Second, "the S3 service's port", func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	s.addr = ln.Addr().String()
	s.srv = &http.Server{Handler: s.handler}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
}

func (s *s3Service) stop() {
	if s.srv != nil {
		_ = s.srv.Close()
		<-s.done
		s.srv = nil
	}
}

const archiveFile = `
workflows:
  - name: kept
    steps:
      - {action: book, agent: keeper, timeout: 20s, compensation: {action: unbook, agent: keeper}}
      - {action: confirm, agent: keeper, timeout: 20s}
`

// TestArchiveBeforeRetention, with real binaries and an S3-compatible
// bucket on loopback: ended orders past retention are written to the
// archive as their whole record and only then deleted; with the archive
// stopped (5 s, 25 retention rounds; SAS_ARCHIVE_DOWN sets it), retention waits,
// nothing is deleted or lost and the supervisor says so; started again,
// retention goes on, and every order reads back by sasctl and the API.
func TestArchiveBeforeRetention(t *testing.T) {
	t.Parallel()
	down := 5 * time.Second
	if d, err := time.ParseDuration(os.Getenv("SAS_ARCHIVE_DOWN")); err == nil && d > 0 {
		down = d
	}
	s3 := startS3(t, "sas-archive")
	archiveEnv := []string{"SAS_ARCHIVE=s3://sas-archive/orders", "SAS_ARCHIVE_S3_ENDPOINT=http://" + s3.addr,
		"SAS_ARCHIVE_S3_ACCESS_KEY=e2e-access", "SAS_ARCHIVE_S3_SECRET_KEY=e2e-archive-secret"}
	g := runFile(t, "archive.yaml", archiveFile, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1,
		supervisorEnv: append([]string{"SAS_RETENTION=1s", "SAS_RETENTION_INTERVAL=200ms", "SAS_RETENTION_BATCH=7"}, archiveEnv...)})
	p := g.pipeline
	sup := p.supervisors[0]
	first := g.submit(t, "kept", slices.Repeat([]string{`{"n": 1}`}, 30))
	p.waitTerminal(t, first, time.Minute)
	testenv.Eventually(t, time.Minute, "the first orders archived and deleted", func() bool {
		return p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, first) == 0
	})
	if n := sup.metric(t, "sas_archived_total"); n < float64(len(first)) {
		t.Fatalf("sas_archived_total %v, want at least %d", n, len(first))
	}

	// The archive goes away; the next orders end and wait past retention.
	s3.stop()
	second := g.submit(t, "kept", slices.Repeat([]string{`{"n": 2}`}, 20))
	p.waitTerminal(t, second, time.Minute)
	testenv.Eventually(t, 30*time.Second, "the supervisor to say the archive is down", func() bool {
		return sup.metric(t, "sas_archive_up") == 0 && sup.metric(t, "sas_archive_errors_total") > 0
	})
	downSince := time.Now()
	for time.Since(downSince) < down {
		if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, second); n != len(second) {
			t.Fatalf("%d of %d orders left while the archive was down: retention deleted what it could not archive", n, len(second))
		}
		time.Sleep(time.Second) // a look a second, while the archive is down
	}
	s3.start(t, s3.addr)
	testenv.Eventually(t, time.Minute, "retention to go on once the archive is back", func() bool {
		return p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, second) == 0
	})
	if sup.metric(t, "sas_archive_up") != 1 {
		t.Fatal("sas_archive_up is not 1 once the archive took documents again")
	}

	// Every order reads back, whole.
	env := append(slices.Clone(p.env), archiveEnv...)
	for _, id := range slices.Concat(first, second) {
		out := sasctlOK(t, env, "orders", "show", "--archived", "--json", id)
		var d statestore.ArchivedOrder
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("the archived record of %s: %v\n%s", id, err, out)
		}
		if d.Order.OrderID != id || d.Order.Status != statestore.OrderCompleted || len(d.Steps) != 3 || len(d.History) < 5 {
			t.Fatalf("the archived record of %s: %s, %d steps, %d history rows", id, d.Order.Status, len(d.Steps), len(d.History))
		}
	}
	out, _, code := sasctl(t, env, "orders", "show", "--archived", second[0])
	if code != 0 || !strings.Contains(out, "archived") || !strings.Contains(out, "completed") || strings.Contains(out, "e2e-archive-secret") {
		t.Fatalf("orders show --archived:\n%s", out)
	}
	if strings.Contains(sup.tail(), "e2e-archive-secret") {
		t.Fatal("the supervisor's log shows the archive's secret key")
	}

	// Through the API.
	api := startAPI(t, p.stack, "", append([]string{"SAS_WORKFLOWS_FILE=" + g.file}, archiveEnv...)...)
	token := apiToken(t, p.stack, "archive-reader", statestore.TokenViewer)
	code, _, body := api.call(t, apiCall{method: http.MethodGet, path: "/api/v1/orders/" + first[0] + "/archived", token: token})
	if code != http.StatusOK || !strings.Contains(string(body), first[0]) || strings.Contains(string(body), "e2e-archive-secret") {
		t.Fatalf("GET archived: %d %s", code, body)
	}
	code, _, body = api.call(t, apiCall{method: http.MethodGet, path: "/api/v1/orders/" + messages.NewID() + "/archived", token: token})
	if code != http.StatusNotFound {
		t.Fatalf("GET archived of an order never archived: %d %s", code, body)
	}
}
