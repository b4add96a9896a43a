// Package steptoken mints and reads a step's token: what a remote service
// that answered a call 202 Accepted presents when it posts the step's
// completion, failure or heartbeat later (contract.HeaderStepToken).
//
// A token names one attempt of one step of one order and carries an
// HMAC-SHA256, cut to 128 bits, of those three under a key that only the
// schedulers read (it is made by a migration and kept in the state store).
// So a token cannot be made up or moved to another step or order; a token
// of an earlier attempt reads as that attempt, and the state store's fence
// refuses it as it refuses a stale reply.
package steptoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// prefix names the token's format: a later format gets another.
const prefix = "st1"

// MaxLen is the longest token this package mints (a 36-character order
// id and two numbers of at most 10 digits): longer is never one.
const MaxLen = 120

// MinKeyLen is the least length of a key, in bytes.
const MinKeyLen = 32

// macLen is the bytes of the HMAC a token keeps.
const macLen = 16

// Ref is the attempt a token names.
type Ref struct {
	OrderID string
	Step    int
	Attempt int
}

// Key mints and reads tokens.
type Key struct{ secret []byte }

// NewKey makes a Key of secret, which must be at least MinKeyLen bytes.
func NewKey(secret string) (Key, error) {
	if len(secret) < MinKeyLen {
		return Key{}, fmt.Errorf("a step token key must be at least %d bytes, this one is %d", MinKeyLen, len(secret))
	}
	return Key{secret: []byte(secret)}, nil
}

// Mint is the token of r: st1.ORDER.STEP.ATTEMPT.MAC.
func (k Key) Mint(r Ref) string {
	body := prefix + "." + r.OrderID + "." + strconv.Itoa(r.Step) + "." + strconv.Itoa(r.Attempt)
	return body + "." + base64.RawURLEncoding.EncodeToString(k.mac(body))
}

func (k Key) mac(body string) []byte {
	h := hmac.New(sha256.New, k.secret)
	h.Write([]byte(body))
	return h.Sum(nil)[:macLen]
}

// ErrInvalid is why a token is not one this key minted.
var ErrInvalid = errors.New("the token is not a step token sas made (Sas-Step-Token of a call)")

// Read reads a token this key minted. Any other string, a changed
// character included, is ErrInvalid; nothing else is said of why.
func (k Key) Read(token string) (Ref, error) {
	if len(token) > MaxLen || len(k.secret) == 0 {
		return Ref{}, ErrInvalid
	}
	dot := strings.LastIndexByte(token, '.')
	if dot < 0 {
		return Ref{}, ErrInvalid
	}
	body, sum := token[:dot], token[dot+1:]
	got, err := base64.RawURLEncoding.Strict().DecodeString(sum)
	if err != nil || !hmac.Equal(got, k.mac(body)) {
		return Ref{}, ErrInvalid
	}
	parts := strings.Split(body, ".")
	if len(parts) != 4 || parts[0] != prefix {
		return Ref{}, ErrInvalid
	}
	step, err1 := strconv.Atoi(parts[2])
	attempt, err2 := strconv.Atoi(parts[3])
	if err1 != nil || err2 != nil || step < 1 || attempt < 1 || parts[1] == "" {
		return Ref{}, ErrInvalid
	}
	return Ref{OrderID: parts[1], Step: step, Attempt: attempt}, nil
}

// OrderOf is the order a token says it is for, unchecked ("" when it
// says none): only to address a refusal to the token's sender.
func OrderOf(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 5 || parts[0] != prefix {
		return ""
	}
	return parts[1]
}
