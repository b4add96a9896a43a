package service_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/secrets"
	"sas/internal/service"
)

// secretMarkers make up every fuzzed password, around the fuzzed text,
// so that a leak of any part of a password holds one of them, and no log
// line holds one by chance.
var secretMarkers = []string{"Hq7Head", "Mq7Mid", "Tq7Tail"}

// FuzzSecretsStayOutOfLogs runs a service's real start-up paths (the
// configuration check, the database and broker connections with their
// retries and readiness answers) with passwords holding any bytes, written
// into the URLs as an operator might (raw or encoded) or given apart, in
// front of: a URL that does not parse, a closed port (dial failure), and
// a server that refuses the login. No log line, returned error or /readyz
// answer may hold any part of the password.
func FuzzSecretsStayOutOfLogs(f *testing.F) {
	for _, sep := range []string{"", "/", "@", ":", "#", "%", "?", " ", "ü", "%2F", "#/?@:%", "%41", "\t", `"`, `\`, "'", "%zz", "@@", "😀", "\n", "://"} {
		f.Add(sep)
	}
	dbURL, amqpURL := testenv.DatabaseURL(), testenv.AMQPURL()
	testenv.Reachable(f)
	db, err := url.Parse(dbURL)
	if err != nil {
		f.Fatal(err)
	}
	amqpHost := hostOf(f, amqpURL)
	f.Fuzz(func(t *testing.T, sep string) {
		t.Parallel() // a refused login takes RabbitMQ 3 s to answer
		pw := secretMarkers[0] + sep + secretMarkers[1] + sep + secretMarkers[2]
		enc := url.UserPassword("x", pw).String()[2:]
		pgAt := func(user, pass, host string) string {
			return "postgres://" + user + ":" + pass + "@" + host + db.Path + "?sslmode=disable"
		}
		cases := []service.Common{
			// Written into the URL by hand: mostly refused by the check.
			{AMQPURL: "amqp://sas:" + pw + "@" + amqpHost + "/"},
			{DatabaseURL: pgAt("nosuchrole", pw, db.Host)},
			// Encoded: the login is refused, or the port is closed.
			{AMQPURL: "amqp://sas:" + enc + "@" + amqpHost + "/"},
			{AMQPURL: "amqp://sas:" + enc + "@127.0.0.1:1/"},
			{DatabaseURL: pgAt("nosuchrole", enc, db.Host)},
			{DatabaseURL: pgAt("nosuchrole", enc, "127.0.0.1:1")},
			// Given apart.
			{AMQPURL: "amqp://sas@" + amqpHost + "/", AMQPPassword: pw},
			{DatabaseURL: "postgres://nosuchrole@" + db.Host + db.Path + "?sslmode=disable", DatabasePassword: pw},
		}
		var wg sync.WaitGroup
		for i, c := range cases {
			wg.Go(func() {
				if leak := startWith(t, c); leak != "" {
					t.Errorf("case %d (password %q): a part of the password reached the outside:\n%s", i, pw, leak)
				}
			})
		}
		wg.Wait()
	})
}

// startWith starts a service's dependencies as Main and a service's Run
// would, with c's connection settings, for a moment, and returns any text
// that left it (log, error, /readyz) holding a secret marker, or "". It
// runs on a goroutine of its own: it reports failures with t.Error.
func startWith(t *testing.T, c service.Common) string {
	environ := []string{"SAS_DATABASE_URL=" + c.DatabaseURL, "SAS_AMQP_URL=" + c.AMQPURL,
		"SAS_DATABASE_PASSWORD=" + c.DatabasePassword, "SAS_AMQP_PASSWORD=" + c.AMQPPassword}
	var out bytes.Buffer
	logger, err := service.NewLogger(&out, "debug", secrets.FromEnviron(environ))
	if err != nil {
		t.Error(err)
		return ""
	}
	withDB := int32(0)
	if c.DatabaseURL == "" {
		c.DatabaseURL = "postgres://unused@127.0.0.1:1/unused"
	} else {
		withDB = 1
	}
	if c.AMQPURL == "" {
		c.AMQPURL = "amqp://unused@127.0.0.1:1/"
	}
	if err := c.Check(); err != nil {
		fmt.Fprintln(&out, "check:", err)
		return leaked(out.String())
	}
	reg := service.NewRegistry()
	ops, err := service.ListenOps("127.0.0.1:0", reg, service.NotReady("starting"), logger)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer ops.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		deps, err := service.Open(ctx, c, "fuzz", c.Database(withDB), broker.Topology{Prefix: "fuzz."}, reg, ops, logger)
		if err == nil {
			deps.Close()
			return
		}
		fmt.Fprintln(&out, "open:", err)
	}()
	// What /readyz says while it waits.
	for {
		select {
		case <-done:
			return leaked(out.String())
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := http.Get("http://" + ops.Addr() + "/readyz")
		if err != nil {
			t.Error(err)
			<-done
			return ""
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if l := leaked(string(body)); l != "" {
			<-done
			return "/readyz: " + l
		}
	}
}

func leaked(text string) string {
	for _, m := range secretMarkers {
		if strings.Contains(text, m) {
			return text
		}
	}
	return ""
}

func hostOf(f *testing.F, raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		f.Fatal(err)
	}
	return u.Host
}

// The logger redacts whatever reaches it, in the message, in attributes
// and in errors, and writes durations as text.
func TestLoggerRedactsAndWritesDurationsAsText(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	logger, err := service.NewLogger(&out, "info", secrets.FromEnviron([]string{"SAS_AMQP_PASSWORD=Top/Secret#1"}))
	if err != nil {
		t.Fatal(err)
	}
	logger.With("url", "amqp://sas:Top/Secret#1@rabbit/").Warn("dial amqp://u:other%20pw@h/ failed",
		"err", fmt.Errorf("wrapped: %w", errors.New(`parse "amqp://sas:Top/Secret#1@rabbit/": invalid port`)),
		"dsn", "host=db password='x y z'", "retry_in", 1500*time.Millisecond,
		"nested", slog.GroupValue(slog.String("pw", "Top/Secret#1"), slog.Duration("took", time.Second)))
	line := out.String()
	for _, secret := range []string{"Top", "Secret", "other", "x y z"} {
		if strings.Contains(line, secret) {
			t.Errorf("%q in %s", secret, line)
		}
	}
	for _, want := range []string{`"retry_in":"1.5s"`, `"took":"1s"`, `amqp://sas:xxxxx@rabbit/`, `password=xxxxx`} {
		if !strings.Contains(line, want) {
			t.Errorf("want %s in %s", want, line)
		}
	}
}
