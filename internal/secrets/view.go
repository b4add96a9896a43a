package secrets

import (
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// span is the bytes [lo, hi) of a text to mask; an empty one (lo == hi)
// still gets a Mask (an empty password in a URL is shown as one).
type span struct{ lo, hi int }

// maskSpans returns s with each of spans, merged where they overlap,
// replaced by one Mask.
func maskSpans(s string, spans []span) string {
	if len(spans) == 0 {
		return s
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.lo != b.lo {
			return a.lo - b.lo
		}
		return a.hi - b.hi
	})
	var b strings.Builder
	last := 0
	for i := 0; i < len(spans); {
		cur := spans[i]
		for i++; i < len(spans) && spans[i].lo < cur.hi; i++ {
			cur.hi = max(cur.hi, spans[i].hi)
		}
		cur.lo = max(cur.lo, last)
		if cur.hi < cur.lo {
			continue
		}
		b.WriteString(s[last:cur.lo])
		b.WriteString(Mask)
		last = cur.hi
	}
	b.WriteString(s[last:])
	return b.String()
}

// mayBeEncoded: s holds an escape, a percent or an ampersand, which may
// spell a secret encoded.
func mayBeEncoded(s string) bool { return strings.ContainsAny(s, `\%&`) }

// view is a text as a reader would read it once one level more of its
// encodings is taken for what it stands for: lo[i] and hi[i] are the
// bytes of the raw text that text[i] was read from.
type view struct {
	text   string
	lo, hi []int
}

// raw is the span of the raw text that sp of the view was read from.
func (v view) raw(sp span) span {
	if sp.hi <= sp.lo {
		return span{v.lo[min(sp.lo, len(v.lo)-1)], v.lo[min(sp.lo, len(v.lo)-1)]}
	}
	return span{v.lo[sp.lo], v.hi[sp.hi-1]}
}

// maxLevels bounds how many levels of encoding are read through (a JSON
// string holding a JSON document holding a percent-encoded value is
// three).
const maxLevels = 3

// views reads s through up to maxLevels levels of encoding, each view
// mapped back to s; it stops at the first level that decodes nothing.
func views(s string) []view {
	var out []view
	cur := view{text: s}
	for range maxLevels {
		text, lo, hi, changed := decodeOnce(cur.text)
		if !changed {
			break
		}
		next := view{text: text, lo: lo, hi: hi}
		if len(out) > 0 {
			// Compose with the level below: bytes of the last view are
			// bytes of the raw text through its maps.
			for i := range next.lo {
				next.lo[i] = cur.lo[next.lo[i]]
				next.hi[i] = cur.hi[next.hi[i]-1]
			}
		}
		out = append(out, next)
		cur = next
		if !mayBeEncoded(text) {
			break
		}
	}
	return out
}

// decodeOnce takes every JSON escape, percent-encoding and HTML character
// reference of s for what it stands for, once; lo[i] and hi[i] are the
// bytes of s the i-th byte of the result was read from. Anything that is
// no such encoding is kept as it is.
func decodeOnce(s string) (string, []int, []int, bool) {
	var b []byte
	var lo, hi []int
	changed := false
	emit := func(p []byte, from, to int) {
		b = append(b, p...)
		for range p {
			lo, hi = append(lo, from), append(hi, to)
		}
	}
	for i := 0; i < len(s); {
		if r, n, ok := decodeAt(s, i); ok {
			var buf [utf8.UTFMax]byte
			if r < 0 {
				buf[0] = byte(-r - 1)
				emit(buf[:1], i, i+n)
			} else {
				w := utf8.EncodeRune(buf[:], r)
				emit(buf[:w], i, i+n)
			}
			changed = true
			i += n
			continue
		}
		emit([]byte{s[i]}, i, i+1)
		i++
	}
	return string(b), lo, hi, changed
}

// decodeAt reads an encoding at s[i]: the rune it stands for (a byte b,
// for a percent-encoding, as -b-1) and its length; ok false when none
// starts there.
func decodeAt(s string, i int) (rune, int, bool) {
	switch s[i] {
	case '\\':
		if i+1 >= len(s) {
			return 0, 0, false
		}
		switch c := s[i+1]; c {
		case '"', '\\', '/', '\'':
			return rune(c), 2, true
		case 'b':
			return '\b', 2, true
		case 'f':
			return '\f', 2, true
		case 'n':
			return '\n', 2, true
		case 'r':
			return '\r', 2, true
		case 't':
			return '\t', 2, true
		case 'u':
			r, ok := hex4(s, i+2)
			if !ok {
				return 0, 0, false
			}
			if utf16.IsSurrogate(r) && i+11 < len(s) && s[i+6] == '\\' && s[i+7] == 'u' {
				if r2, ok := hex4(s, i+8); ok {
					if p := utf16.DecodeRune(r, r2); p != utf8.RuneError {
						return p, 12, true
					}
				}
			}
			return r, 6, true
		case 'x':
			if i+3 < len(s) {
				if v, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
					return -rune(v) - 1, 4, true
				}
			}
		}
	case '%':
		if i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				return -rune(v) - 1, 3, true
			}
		}
	case '&':
		end := strings.IndexByte(s[i:min(len(s), i+12)], ';')
		if end < 2 {
			return 0, 0, false
		}
		ref := s[i+1 : i+end]
		switch ref {
		case "quot":
			return '"', end + 1, true
		case "amp":
			return '&', end + 1, true
		case "lt":
			return '<', end + 1, true
		case "gt":
			return '>', end + 1, true
		case "apos":
			return '\'', end + 1, true
		}
		if num, ok := strings.CutPrefix(ref, "#"); ok {
			base := 10
			if h, ok := strings.CutPrefix(num, "x"); ok {
				num, base = h, 16
			} else if h, ok := strings.CutPrefix(num, "X"); ok {
				num, base = h, 16
			}
			if v, err := strconv.ParseUint(num, base, 32); err == nil && v <= utf8.MaxRune {
				return rune(v), end + 1, true
			}
		}
	}
	return 0, 0, false
}

// hex4 reads four hex digits at s[i].
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s[i:i+4], 16, 16)
	return rune(v), err == nil
}

// base64Cores adds, for a secret of at least 6 bytes, the parts of its
// base64 encodings (standard and URL alphabets) that are the same
// wherever it stands in the encoded text (at each of the three byte
// alignments, the characters no neighbour changes), when they are at
// least 8 characters: a secret echoed inside a base64 value (an
// Authorization: Basic header of user:secret) is found there too.
func base64Cores(s string, add func(string)) {
	if len(s) < 6 {
		return
	}
	for k := range 3 {
		b := append(make([]byte, k), s...)
		first := (8*k + 5) / 6
		last := 8 * len(b) / 6
		if last-first < 8 {
			continue
		}
		add(base64.StdEncoding.EncodeToString(b)[first:last])
		add(base64.URLEncoding.EncodeToString(b)[first:last])
	}
}

// Holds reports whether text holds secret in any form String would mask
// it in (as written, JSON-escaped, percent-encoded, as HTML character
// references, base64, to three levels of encoding): for a check that no
// secret survives in what sas keeps, shows or exports.
func Holds(text, secret string) bool {
	r := New(secret)
	if len(r.secrets) == 0 {
		return strings.Contains(text, secret)
	}
	if len(r.secretSpans(text, nil)) > 0 {
		return true
	}
	if mayBeEncoded(text) {
		for _, v := range views(text) {
			if len(r.secretSpans(v.text, nil)) > 0 {
				return true
			}
		}
	}
	return false
}
