package service

import (
	"context"
	"log/slog"
	"sync"
)

// lazyHandler hands the attributes of a logger's With to h only when the
// logger first writes a record at a level h takes. The services make a
// logger for each message they handle (its order, step and attempt) and
// that logger mostly writes nothing; a JSON handler redacts and formats
// the attributes it is given at once, which cost an agent a sixteenth of
// its CPU at full load. Values are resolved (slog.LogValuer) as With is
// called; a value of a mutable type passed to With is read when the first
// record is written.
type lazyHandler struct {
	// h takes the attributes given before this handler's own.
	h slog.Handler
	// with holds this handler's own attributes until they are given to
	// h, then the handler that took them (nil: none of its own).
	with *pendingAttrs
}

// pendingAttrs are a With's attributes, given to a handler at most once.
type pendingAttrs struct {
	once  sync.Once
	attrs []slog.Attr
	h     slog.Handler
}

// lazy wraps h so that its loggers' With costs a copy of the attributes
// until they write a record.
func lazy(h slog.Handler) slog.Handler {
	if l, ok := h.(lazyHandler); ok {
		return l
	}
	return lazyHandler{h: h}
}

// handler is h with this handler's own attributes.
func (l lazyHandler) handler() slog.Handler {
	if l.with == nil {
		return l.h
	}
	l.with.once.Do(func() {
		l.with.h, l.with.attrs = l.h.WithAttrs(l.with.attrs), nil
	})
	return l.with.h
}

// Enabled asks h: attributes do not change which levels a handler takes.
func (l lazyHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.h.Enabled(ctx, level)
}

func (l lazyHandler) Handle(ctx context.Context, r slog.Record) error {
	return l.handler().Handle(ctx, r)
}

func (l lazyHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return l
	}
	// slog hands the slice over (a handler may keep it); its values are
	// resolved now, as a handler taking them at once would.
	for i := range as {
		as[i].Value = as[i].Value.Resolve()
	}
	return lazyHandler{h: l.handler(), with: &pendingAttrs{attrs: as}}
}

func (l lazyHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return l
	}
	return lazyHandler{h: l.handler().WithGroup(name)}
}
