package service

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// countingHandler counts the attributes handed to its WithAttrs.
type countingHandler struct {
	slog.Handler
	n *int
}

func (c countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	*c.n += len(as)
	return countingHandler{Handler: c.Handler.WithAttrs(as), n: c.n}
}

func (c countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{Handler: c.Handler.WithGroup(name), n: c.n}
}

// A logger made for one message costs its handler nothing until it
// writes: its attributes reach the JSON handler with its first record at
// a level written, once, and the lines are those of a JSON handler given
// them at once.
func TestWithCostsNothingUntilALineIsWritten(t *testing.T) {
	t.Parallel()
	var lazyOut, plainOut bytes.Buffer
	taken := 0
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	lazyLog := slog.New(lazy(countingHandler{Handler: slog.NewJSONHandler(&lazyOut, opts), n: &taken}))
	plainLog := slog.New(slog.NewJSONHandler(&plainOut, opts))

	// The service's logger takes its attribute once, as the first
	// message's logger is made from it; the messages' loggers, which write
	// nothing at the level set, give theirs to nobody.
	for _, l := range []*slog.Logger{lazyLog, plainLog} {
		svc := l.With("service", "agent")
		for i := range 3 {
			msg := svc.With("order_id", "o-1", "step", i)
			msg.Debug("not written")
		}
	}
	if taken != 1 {
		t.Fatalf("%d attributes given to the handler before any line was written, want the service's 1", taken)
	}
	taken = 0
	if lazyOut.Len() != 0 {
		t.Fatalf("debug line written: %s", lazyOut.String())
	}

	for _, l := range []*slog.Logger{lazyLog, plainLog} {
		state := "at With"
		msg := l.With("service", "agent").With("order_id", "o-2", "lazy", valuer{&state}).WithGroup("call").With("try", 2)
		state = "changed after With"
		msg.Info("first", "status", 200)
		msg.Warn("second")
	}
	if lazyOut.String() != stripTimes(t, plainOut.String(), lazyOut.String()) {
		t.Errorf("lines differ:\n lazy  %s plain %s", lazyOut.String(), plainOut.String())
	}
	if !bytes.Contains(lazyOut.Bytes(), []byte(`"lazy":"at With"`)) {
		t.Errorf("a LogValuer was not resolved as With was called: %s", lazyOut.String())
	}
	// service, order_id, lazy and try, each once though two lines were
	// written.
	if taken != 4 {
		t.Errorf("%d attributes given to the handler, want 4", taken)
	}
}

// A logger's attributes are given to its handler once even when its first
// lines are written at the same time.
func TestWithIsTakenOnceUnderConcurrentLines(t *testing.T) {
	t.Parallel()
	// slog's handlers made from one another share one lock around their
	// writes.
	var out bytes.Buffer
	taken := 0
	msg := slog.New(lazy(countingHandler{Handler: slog.NewJSONHandler(&out, nil), n: &taken})).With("order_id", "o-3")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { msg.Info("line") })
	}
	wg.Wait()
	if taken != 1 {
		t.Errorf("attributes given %d times, want once", taken)
	}
	if n := bytes.Count(out.Bytes(), []byte(`"order_id":"o-3"`)); n != 8 {
		t.Errorf("%d of 8 lines carry the attribute", n)
	}
}

type valuer struct{ s *string }

func (v valuer) LogValue() slog.Value { return slog.StringValue(*v.s) }

// stripTimes returns plain's lines with their times replaced by lazy's, so
// that the two compare.
func stripTimes(t *testing.T, plain, lazy string) string {
	t.Helper()
	p, l := bytes.Split([]byte(plain), []byte("\n")), bytes.Split([]byte(lazy), []byte("\n"))
	if len(p) != len(l) {
		return plain
	}
	for i := range p {
		if len(p[i]) < 40 || len(l[i]) < 40 {
			continue
		}
		// {"time":"2006-01-02T15:04:05.999999999Z07:00", ...
		pe, le := bytes.IndexByte(p[i][9:], '"')+9, bytes.IndexByte(l[i][9:], '"')+9
		p[i] = append(append([]byte{}, l[i][:le]...), p[i][pe:]...)
	}
	return string(bytes.Join(p, []byte("\n")))
}
