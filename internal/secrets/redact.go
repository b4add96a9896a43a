package secrets

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// minSecret is the shortest secret looked for as plain text: a shorter one
// would blank out every occurrence of its letters in a log. Shorter
// passwords are still removed where they stand in a URL or a connection
// string (Scrub).
const minSecret = 4

// Redactor removes known secrets from text, in every form they are
// likely to be written in (as given, percent-encoded or decoded, quoted),
// and then, as Scrub does, the password of anything that looks like a URL
// with user info or a PostgreSQL connection string. It never changes
// after New and is safe for concurrent use.
type Redactor struct {
	secrets []string // longest first, so a secret inside another goes whole
}

// New returns a redactor for values: a value that looks like a URL or a
// connection string contributes the passwords it may hold (every reading
// of it, parseable or not); any other value is a secret itself.
func New(values ...string) *Redactor {
	set := map[string]bool{}
	add := func(s string) {
		if len(s) >= minSecret {
			set[s] = true
		}
	}
	for _, v := range values {
		switch {
		case v == "":
		case strings.Contains(v, "://") || strings.Contains(v, "password="):
			// A parser that misreads a malformed URL quotes pieces of
			// its password (`invalid port ":Top"` for "Top/Secret"):
			// there, every run of letters and digits of the password is
			// a secret too.
			malformed := CheckURL("", v) != nil
			for _, pw := range passwordsIn(v) {
				variants(pw, add)
				if !malformed {
					continue
				}
				for _, piece := range strings.FieldsFunc(pw, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
					variants(piece, add)
				}
			}
		default:
			variants(v, add)
		}
	}
	r := &Redactor{}
	for s := range set {
		r.secrets = append(r.secrets, s)
	}
	sort.Slice(r.secrets, func(i, j int) bool {
		if len(r.secrets[i]) != len(r.secrets[j]) {
			return len(r.secrets[i]) > len(r.secrets[j])
		}
		return r.secrets[i] < r.secrets[j]
	})
	return r
}

// FromEnviron returns a redactor for the secrets in an environment
// (os.Environ's form): the values of SAS_ variables named …_URL or holding
// PASSWORD or SECRET in their name, and PGPASSWORD, which the PostgreSQL
// driver reads.
func FromEnviron(environ []string) *Redactor {
	var values []string
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			continue
		}
		secret := k == "PGPASSWORD" || strings.HasPrefix(k, "SAS_") &&
			(strings.HasSuffix(k, "_URL") || strings.Contains(k, "PASSWORD") || strings.Contains(k, "SECRET"))
		if secret {
			values = append(values, v)
		}
	}
	return New(values...)
}

// variants adds s as written, percent-encoded the ways a URL encodes it,
// percent-decoded, quoted as Go's %q writes it (url.Error does), and the
// parts of its base64 forms that stay the same wherever it stands (a
// JSON-escaped, percent-encoded or HTML-escaped echo is read back to the
// secret itself by String).
func variants(s string, add func(string)) {
	add(s)
	add(url.QueryEscape(s))
	add(url.PathEscape(s))
	add(strings.TrimPrefix(url.UserPassword("", s).String(), ":"))
	if d, err := url.PathUnescape(s); err == nil {
		add(d)
	}
	if d, err := url.QueryUnescape(s); err == nil {
		add(d)
	}
	q := strconv.Quote(s)
	add(q[1 : len(q)-1])
	base64Cores(s, add)
}

// passwordsIn returns every text a URL or connection string v may hold
// as its password: for a URL, the text from the first colon after "://"
// to each @ after it (the password of a URL whose password holds an @, /
// or # is read differently by different parsers), and the password
// net/url reads; for a connection string, the value of password=.
func passwordsIn(v string) []string {
	var out []string
	if i := strings.Index(v, "://"); i >= 0 {
		rest := v[i+3:]
		if colon := strings.IndexByte(rest, ':'); colon >= 0 {
			for j := colon + 1; j < len(rest); j++ {
				if rest[j] == '@' {
					out = append(out, rest[colon+1:j])
				}
			}
		}
		if u, err := url.Parse(v); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok {
				out = append(out, pw)
			}
		}
	}
	for rest := v; ; {
		i := strings.Index(rest, "password=")
		if i < 0 {
			break
		}
		val, end := dsnValue(rest[i+len("password="):])
		out = append(out, val)
		rest = rest[i+len("password=")+end:]
	}
	return out
}

// dsnValue reads a keyword/value connection string's value at the start
// of s: quoted ('…', with \' and \\ escapes) or up to the next space. It
// returns the value and how many bytes it took.
func dsnValue(s string) (string, int) {
	if !strings.HasPrefix(s, "'") {
		end := strings.IndexAny(s, " \t\n")
		if end < 0 {
			end = len(s)
		}
		return s[:end], end
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i])
			}
		case '\'':
			return b.String(), i + 1
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), len(s)
}

// String returns s with every known secret and every password in a URL
// or connection string (and credential after an auth scheme) replaced by
// Mask: as written, and as a reader of s would read it once its JSON
// escapes (\/, \u0050, \"), percent-encodings (%50) and HTML character
// references (&#80;) are taken for the characters they stand for, to
// three levels of such encoding, mixed as they may be. What is masked is
// the text that spells the secret, in whatever form it is written.
func (r *Redactor) String(s string) string {
	spans := r.spans(s, nil)
	if mayBeEncoded(s) {
		for _, v := range views(s) {
			for _, sp := range r.spans(v.text, nil) {
				spans = append(spans, v.raw(sp))
			}
		}
	}
	return maskSpans(s, spans)
}

// spans adds to out the spans of s to mask: the known secrets as
// written, then what Scrub masks.
func (r *Redactor) spans(s string, out []span) []span {
	return scrubSpans(s, r.secretSpans(s, out))
}

// secretSpans adds to out every place a known secret is written in s.
func (r *Redactor) secretSpans(s string, out []span) []span {
	if r == nil {
		return out
	}
	for _, sec := range r.secrets {
		for from := 0; ; {
			i := strings.Index(s[from:], sec)
			if i < 0 {
				break
			}
			out = append(out, span{from + i, from + i + len(sec)})
			from += i + len(sec)
		}
	}
	return out
}

// Err returns err with its text redacted (errors.Is and errors.As still
// see err), or err itself when its text holds nothing to hide.
func (r *Redactor) Err(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := r.String(msg); red != msg {
		return &redacted{msg: red, err: err}
	}
	return err
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// Attr redacts a log attribute's value: strings, errors, and anything
// else whose printed form holds a secret (slog.HandlerOptions.ReplaceAttr
// calls it for every attribute and for the message).
func (r *Redactor) Attr(a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); r.String(s) != s {
			a.Value = slog.StringValue(r.String(s))
		}
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case nil:
		case error:
			a.Value = slog.StringValue(r.String(v.Error()))
		default:
			if s := fmt.Sprint(v); r.String(s) != s {
				a.Value = slog.StringValue(r.String(s))
			}
		}
	}
	return a
}

// Scrub replaces the password of anything in s that looks like a URL
// with user info (scheme://user:password@…) or a PostgreSQL connection
// string (password=…) with Mask. It does not need the URL to parse: the
// password is taken to run from the colon after the user name to the last
// @ before the line or the next URL ends, so a password holding / @ : # %
// ? or spaces goes whole. At worst it hides more than the password.
func Scrub(s string) string { return maskSpans(s, scrubSpans(s, nil)) }

// scrubSpans adds to out the spans of s that Scrub masks.
func scrubSpans(s string, out []span) []span {
	if strings.Contains(s, "://") {
		out = urlSpans(s, out)
	}
	if strings.Contains(s, "password=") {
		out = dsnSpans(s, out)
	}
	if hasAuthScheme(s) {
		out = authSpans(s, out)
	}
	return out
}

// authSchemes are the HTTP authorization schemes whose credentials Scrub
// masks wherever they are written out ("Bearer eyJ…", "basic dXNlcjpw…").
var authSchemes = [...]string{"bearer", "basic", "token"}

// hasAuthScheme: s holds a word of authSchemes followed by a space, in
// any case. It allocates nothing: most text holds none.
func hasAuthScheme(s string) bool {
	for i := 0; i+6 <= len(s); i++ {
		if c := s[i] | 0x20; c != 'b' && c != 't' {
			continue
		}
		if _, n := authSchemeAt(s, i); n > 0 {
			return true
		}
	}
	return false
}

// authSchemeAt reports whether an auth scheme word followed by spaces
// starts at s[i] (at a word's start), and the length of both.
func authSchemeAt(s string, i int) (string, int) {
	if i > 0 && isTokenChar(s[i-1]) {
		return "", 0
	}
	for _, w := range authSchemes {
		if len(s) > i+len(w) && strings.EqualFold(s[i:i+len(w)], w) && (s[i+len(w)] == ' ' || s[i+len(w)] == '\t') {
			n := len(w)
			for i+n < len(s) && (s[i+n] == ' ' || s[i+n] == '\t') {
				n++
			}
			return w, n
		}
	}
	return "", 0
}

// isTokenChar: a character of an RFC 6750 token (b64token) or a Basic
// credential.
func isTokenChar(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("-._~+/=", c) >= 0
}

// mayHide reports whether raw, a JSON text, may hold something String
// would hide: a secret as written, an escape (which may spell one), or
// what Scrub looks for. Most results hold none, and are passed as they
// are without reading a string of them.
func (r *Redactor) mayHide(raw []byte) bool {
	if bytes.IndexByte(raw, '\\') >= 0 || bytes.Contains(raw, []byte("://")) || bytes.Contains(raw, []byte("password=")) {
		return true
	}
	if r != nil {
		for _, sec := range r.secrets {
			if bytes.Contains(raw, []byte(sec)) {
				return true
			}
		}
	}
	return hasAuthScheme(string(raw))
}

// credentialLike: a word after an auth scheme is taken for a credential
// when it is at least 8 characters and has a digit, a base64 sign, or
// both cases ("eyJhbGci", "sk_live_4f2"): prose after "basic" or "token"
// ("basic information", "token expired") is left alone.
func credentialLike(w string) bool {
	if len(w) < 8 {
		return false
	}
	var digit, sign, upper, lower bool
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c >= '0' && c <= '9':
			digit = true
		case c == '+' || c == '/' || c == '=' || c == '_':
			sign = true
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= 'a' && c <= 'z':
			lower = true
		}
	}
	return digit || sign || upper && lower
}

// authSpans adds the credential after every auth scheme word in s.
func authSpans(s string, out []span) []span {
	for i := 0; i < len(s); i++ {
		_, n := authSchemeAt(s, i)
		if n == 0 {
			continue
		}
		j := i + n
		for j < len(s) && isTokenChar(s[j]) {
			j++
		}
		if !credentialLike(s[i+n : j]) {
			continue
		}
		out = append(out, span{i + n, j})
		i = j - 1
	}
	return out
}

// JSON returns raw, a JSON text, with String applied to every string in
// it (keys too) that holds something to hide, each written back as a JSON
// string; every other byte stays as it was. It returns raw itself when
// nothing changes. raw must be valid JSON.
func (r *Redactor) JSON(raw []byte) []byte {
	if !r.mayHide(raw) {
		return raw
	}
	var out []byte
	last := 0
	for i := 0; i < len(raw); i++ {
		if raw[i] != '"' {
			continue
		}
		start := i
		for i++; i < len(raw) && raw[i] != '"'; i++ {
			if raw[i] == '\\' {
				i++
			}
		}
		tok := raw[start : i+1]
		var v string
		if json.Unmarshal(tok, &v) != nil {
			continue
		}
		red := r.String(v)
		if red == v {
			continue
		}
		enc, err := json.Marshal(red)
		if err != nil {
			continue
		}
		out = append(append(out, raw[last:start]...), enc...)
		last = i + 1
	}
	if out == nil {
		return raw
	}
	return append(out, raw[last:]...)
}

// urlSpans adds the password of every URL with user info in s.
func urlSpans(s string, out []span) []span {
	for pos := 0; ; {
		i := strings.Index(s[pos:], "://")
		if i < 0 {
			return out
		}
		start := pos + i + 3
		rest := s[start:]
		end := len(rest)
		if j := strings.Index(rest, "://"); j >= 0 {
			end = j
		}
		if j := strings.IndexByte(rest[:end], '\n'); j >= 0 {
			end = j
		}
		seg := rest[:end]
		pos = start
		at := strings.LastIndexByte(seg, '@')
		if at < 0 {
			continue
		}
		colon := strings.IndexByte(seg[:at], ':')
		if colon < 0 || strings.ContainsAny(seg[:colon], " \t\"'`<>") {
			continue // a user without a password, or no user-info at all
		}
		out = append(out, span{start + colon + 1, start + at})
		pos = start + at + 1
	}
}

// dsnSpans adds the value of every password= in s.
func dsnSpans(s string, out []span) []span {
	for pos := 0; ; {
		i := strings.Index(s[pos:], "password=")
		if i < 0 {
			return out
		}
		vs := pos + i + len("password=")
		_, n := dsnValue(s[vs:])
		out = append(out, span{vs, vs + n})
		pos = vs + n
	}
}
