package service

import (
	"context"
	"log/slog"

	"sas/internal/secrets"
)

// WithSecrets returns logger with red's secrets also removed from every
// message and attribute: for secrets a service learns after its logger
// was made (an agent's endpoint headers). Its With, too, costs little
// until it writes (lazyHandler).
func WithSecrets(logger *slog.Logger, red *secrets.Redactor) *slog.Logger {
	return slog.New(lazy(redactHandler{h: logger.Handler(), red: red}))
}

type redactHandler struct {
	h   slog.Handler
	red *secrets.Redactor
}

func (r redactHandler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, r.red.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(r.red.Attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = r.red.Attr(a)
	}
	return redactHandler{h: r.h.WithAttrs(clean), red: r.red}
}

func (r redactHandler) WithGroup(name string) slog.Handler {
	return redactHandler{h: r.h.WithGroup(name), red: r.red}
}
