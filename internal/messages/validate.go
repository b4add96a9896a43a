package messages

import (
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Bounds on values. Dates outside [2000-01-01, 2100-01-01) UTC are absurd
// for an order system and are rejected rather than stored.
const (
	minUnix      = 946684800  // 2000-01-01T00:00:00Z
	maxUnix      = 4102444800 // 2100-01-01T00:00:00Z
	maxItems     = 100
	maxQty       = 1_000_000
	maxAmount    = 1_000_000_000_000 // minor units
	maxText      = 200
	maxReasonLen = 2000
	maxPriority  = 9
	// maxCallMicros bounds a reply's call_us: a day.
	maxCallMicros = 24 * 3600 * 1_000_000
)

func checkID(field, id string) error {
	if _, ok := CanonicalID(id); !ok {
		return reject(ReasonInvalidValue, "%s must be a UUID such as 6f1c2d1e-8a55-4e51-9d87-3b2a1c0e9f10", field)
	}
	return nil
}

func checkTime(field string, t time.Time) error {
	if u := t.Unix(); u < minUnix || u >= maxUnix {
		return reject(ReasonInvalidValue, "%s %s is outside [2000-01-01, 2100-01-01)", field, t.Format(time.RFC3339))
	}
	return nil
}

// checkText requires 1..maxLen characters with no control characters.
func checkText(field, s string, maxLen int) error {
	if s == "" {
		return reject(ReasonMissingField, "%s must not be empty", field)
	}
	if n := len([]rune(s)); n > maxLen {
		return reject(ReasonInvalidValue, "%s is %d characters, limit %d", field, n, maxLen)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return reject(ReasonInvalidValue, "%s contains a control character", field)
		}
	}
	return nil
}

// checkName requires 1..maxLen characters from [A-Za-z0-9._:-]; used for
// SKUs, queue names and workflow, step and agent names.
func checkName(field, s string, maxLen int) error {
	if s == "" {
		return reject(ReasonMissingField, "%s must not be empty", field)
	}
	if len(s) > maxLen {
		return reject(ReasonInvalidValue, "%s is %d characters, limit %d", field, len(s), maxLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return reject(ReasonInvalidValue, "%s may hold only letters, digits and . _ : -", field)
		}
	}
	return nil
}

// CheckName reports a name (an agent kind, a workflow, a queue) that a
// message could not carry: empty, over 100 characters, or with characters
// other than letters, digits and . _ : -.
func CheckName(field, s string) error { return checkName(field, s, 100) }

// MaxReasonBytes bounds every reason a message carries (a failed reply's
// error, an alert's reason, a status event's detail), in bytes: what
// BoundText makes always fits.
const MaxReasonBytes = maxReasonLen

// BoundText makes s fit where a message carries text made from what
// someone else wrote (a service's answer, a schema error quoting a
// payload, a dead letter's detail): valid UTF-8, every control character
// (newlines too) a space, and at most maxBytes bytes, cut at a character
// and ending in "…" when cut. Every sender makes its text with it, so
// that no receiver of the same release refuses the message for its text.
func BoundText(s string, maxBytes int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	clean := true
	for _, r := range s {
		if unicode.IsControl(r) {
			clean = false
			break
		}
	}
	if !clean {
		s = strings.Map(func(r rune) rune {
			if unicode.IsControl(r) {
				return ' '
			}
			return r
		}, s)
	}
	if len(s) <= maxBytes {
		return s
	}
	const more = "…"
	cut := max(maxBytes-len(more), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}

// namespaceName is the rule of a namespace's name (the tables' CHECKs say
// the same).
var namespaceName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckNamespace is the rule of a namespace's name: 1 to 63 lower-case
// letters, digits or '-', starting and ending with a letter or digit.
func CheckNamespace(ns string) error {
	if namespaceName.MatchString(ns) {
		return nil
	}
	return fmt.Errorf("namespace %q is not a name: write 1 to 63 lower-case letters, digits or '-', starting and ending with a letter or digit", BoundText(ns, 80))
}
