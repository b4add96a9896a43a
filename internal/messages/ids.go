package messages

import (
	"crypto/rand"
	"crypto/sha1"
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

// DerivedID is the UUID (version 5, SHA-1 of name) that name always
// gives: an id sas derives where a retry must find the same one (a
// sub-process's child from its parent's step).
func DerivedID(name string) string {
	// The namespace is sas's own: a UUID no other name space uses.
	ns := [16]byte{0x5a, 0x5a, 0x0c, 0x1d, 0x8e, 0x4f, 0x4b, 0x2e, 0x9a, 0x61, 0x3d, 0x0b, 0x6c, 0x7e, 0x10, 0x38}
	h := sha1.New()
	h.Write(ns[:])
	h.Write([]byte(name))
	var b [16]byte
	copy(b[:], h.Sum(nil))
	b[6] = b[6]&0x0f | 0x50
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
