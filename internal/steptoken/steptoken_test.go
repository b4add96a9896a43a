package steptoken_test

import (
	"errors"
	"strings"
	"testing"

	"sas/internal/steptoken"
)

const secret = "0123456789abcdef0123456789abcdef-a-test-key"

func TestTokenReadsBackTheAttemptItNames(t *testing.T) {
	k, err := steptoken.NewKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	ref := steptoken.Ref{OrderID: "0b7e5d7c-95b5-4f4e-9d1a-3f0f0c1d2e3f", Step: 12, Attempt: 3}
	tok := k.Mint(ref)
	if len(tok) > steptoken.MaxLen {
		t.Fatalf("token %q is longer than MaxLen %d", tok, steptoken.MaxLen)
	}
	got, err := k.Read(tok)
	if err != nil || got != ref {
		t.Fatalf("Read(%q) = %+v, %v; want %+v", tok, got, err, ref)
	}
	if k.Mint(ref) != tok {
		t.Fatal("the same attempt minted two tokens")
	}
	if k.Mint(steptoken.Ref{OrderID: ref.OrderID, Step: 12, Attempt: 4}) == tok {
		t.Fatal("another attempt got the same token")
	}
}

func TestTokenRefusesWhatItDidNotMint(t *testing.T) {
	k, _ := steptoken.NewKey(secret)
	other, _ := steptoken.NewKey(strings.ToUpper(secret))
	ref := steptoken.Ref{OrderID: "0b7e5d7c-95b5-4f4e-9d1a-3f0f0c1d2e3f", Step: 2, Attempt: 1}
	tok := k.Mint(ref)
	moved := strings.Replace(tok, ".2.1.", ".3.1.", 1)
	bad := map[string]string{
		"empty":        "",
		"another key":  other.Mint(ref),
		"moved step":   moved,
		"one char":     flip(tok, len(tok)-10),
		"last char":    flip(tok, len(tok)-1),
		"cut mac":      tok[:len(tok)-4],
		"no mac":       strings.TrimSuffix(tok, tok[strings.LastIndexByte(tok, '.'):]),
		"too long":     tok + strings.Repeat("x", steptoken.MaxLen),
		"not base64":   tok[:strings.LastIndexByte(tok, '.')+1] + "!!!!",
		"other prefix": "st2" + tok[3:],
		"just dots":    "....",
	}
	for name, tok := range bad {
		if _, err := k.Read(tok); !errors.Is(err, steptoken.ErrInvalid) {
			t.Errorf("%s: Read(%q) = %v, want ErrInvalid", name, tok, err)
		}
	}
	var zero steptoken.Key
	if _, err := zero.Read(tok); !errors.Is(err, steptoken.ErrInvalid) {
		t.Errorf("a key without a secret read a token: %v", err)
	}
	if _, err := steptoken.NewKey("short"); err == nil {
		t.Error("NewKey took a 5-byte secret")
	}
}

// flip changes the character at i of tok into another base64url one.
func flip(tok string, i int) string {
	c := byte('A')
	if tok[i] == 'A' {
		c = 'B'
	}
	return tok[:i] + string(c) + tok[i+1:]
}

func TestOrderOfIsTheOrderATokenNames(t *testing.T) {
	k, _ := steptoken.NewKey(secret)
	id := "0b7e5d7c-95b5-4f4e-9d1a-3f0f0c1d2e3f"
	if got := steptoken.OrderOf(k.Mint(steptoken.Ref{OrderID: id, Step: 1, Attempt: 1})); got != id {
		t.Fatalf("OrderOf = %q, want %q", got, id)
	}
	for _, tok := range []string{"", "x", "st2." + id + ".1.1.mac", "st1." + id + ".1.mac"} {
		if got := steptoken.OrderOf(tok); got != "" {
			t.Errorf("OrderOf(%q) = %q, want none", tok, got)
		}
	}
}
