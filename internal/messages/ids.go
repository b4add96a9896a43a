package messages

import (
	"crypto/rand"
	"fmt"
	"strings"
)

// NewID returns a random (version 4) UUID in canonical lower-case form.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// CanonicalID returns id in canonical lower-case 8-4-4-4-12 form, and false
// if id is not a UUID in that form (in either case).
func CanonicalID(id string) (string, bool) {
	if len(id) != 36 {
		return "", false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return "", false
			}
		}
	}
	lower := strings.ToLower(id)
	if lower == "00000000-0000-0000-0000-000000000000" {
		return "", false
	}
	return lower, true
}
