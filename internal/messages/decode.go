// Package messages defines sas's wire messages (SubmitOrder, StepRequest,
// StepReply, StatusEvent, OperatorAlert): their JSON form, their version,
// and strict decoders that reject anything a sender could get wrong.
//
// Every body carries "schema_version". A decoder rejects, with a
// *DecodeError whose Reason is one of the Reason constants: bodies over
// MaxBodyBytes, invalid UTF-8 or NUL bytes, anything but exactly one JSON
// object, duplicate keys (at any depth), unknown keys, an unknown version,
// missing or null required fields, and out-of-range values.
package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// SchemaVersion is the version of the messages whose form never changed
// (StepReply, StatusEvent, OperatorAlert). SubmitOrder (SubmitOrderVersion,
// and 1) and StepRequest (StepRequestVersion) have their own.
const SchemaVersion = 1

// versioned is a message whose versions, and whose required fields by
// version, differ from the others'.
type versioned interface {
	// required returns the top-level keys the version needs, and false if
	// the version is not read.
	required(version string) ([]string, bool)
}

// ContentType is the content type of every sas message.
const ContentType = "application/json"

// MaxBodyBytes caps a message body: room for a step request's payload
// (MaxPayloadBytes) and the results of a workflow's earlier steps.
const MaxBodyBytes = 512 << 10

// maxDepth caps JSON nesting, so a hostile body cannot exhaust the stack.
const maxDepth = 32

// Reasons a message is rejected. They become the x-error-reason header of a
// dead-lettered message and a metric label, so they are few and stable.
const (
	ReasonTooLarge           = "too_large"
	ReasonInvalidEncoding    = "invalid_encoding"
	ReasonWrongContentType   = "wrong_content_type"
	ReasonNotJSON            = "not_json"
	ReasonTrailingData       = "trailing_data"
	ReasonDuplicateField     = "duplicate_field"
	ReasonUnknownField       = "unknown_field"
	ReasonUnsupportedVersion = "unsupported_version"
	ReasonMissingField       = "missing_field"
	ReasonInvalidValue       = "invalid_value"
)

// Reasons lists every Reason constant: the dead-letter reasons a decoder
// gives.
func Reasons() []string {
	return []string{ReasonTooLarge, ReasonInvalidEncoding, ReasonWrongContentType, ReasonNotJSON, ReasonTrailingData,
		ReasonDuplicateField, ReasonUnknownField, ReasonUnsupportedVersion, ReasonMissingField, ReasonInvalidValue}
}

// DecodeError says why a body was rejected.
type DecodeError struct {
	Reason string
	Detail string
}

func (e *DecodeError) Error() string { return e.Reason + ": " + e.Detail }

// DeadLetterReason gives the reason and detail a dead-lettered message
// carries (it makes a DecodeError a broker.Reasoned).
func (e *DecodeError) DeadLetterReason() (string, string) { return e.Reason, e.Detail }

func reject(reason, format string, args ...any) *DecodeError {
	return &DecodeError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// AsDecodeError returns err's *DecodeError, if it has one.
func AsDecodeError(err error) (*DecodeError, bool) {
	var de *DecodeError
	ok := errors.As(err, &de)
	return de, ok
}

// CheckContentType rejects a content type other than application/json
// (parameters such as charset=utf-8 are allowed).
func CheckContentType(ct string) error {
	mt, _, _ := strings.Cut(ct, ";")
	if !strings.EqualFold(strings.TrimSpace(mt), ContentType) {
		return reject(ReasonWrongContentType, "content type %q, want %s", ct, ContentType)
	}
	return nil
}

// decodeBody checks body and decodes it into dst, a pointer to a struct
// whose fields all have lower-case json tags. required lists top-level
// keys that must be present and not null. It does not check values: each
// message's validate does.
//
// opaque lists top-level keys whose value is free-form JSON (e.g. a remote
// service's result) and maps to json.RawMessage: inside it keys need not be
// snake_case, but duplicates, NUL and depth are still checked.
//
// With fast, a dst that is a fastDecoder fills itself from the walked
// members when it can, and encoding/json decodes it only when it cannot
// (the tests compare the two; production always asks for fast).
func decodeBody(body []byte, dst any, required, opaque []string, fast bool) error {
	if len(body) > MaxBodyBytes {
		return reject(ReasonTooLarge, "body is %d bytes, limit %d", len(body), MaxBodyBytes)
	}
	if err := checkEncoding(body, "body"); err != nil {
		return err
	}
	var members []member
	var err error
	if json.Valid(body) {
		members, err = walk(body, opaque)
	} else {
		// Only a body that is not JSON takes the slow path, which says
		// what is wrong with it.
		_, err = scan(body, opaque)
		if err == nil {
			err = reject(ReasonNotJSON, "body is not valid JSON")
		}
	}
	if err != nil {
		return err
	}
	present := func(key string) bool {
		raw, ok := memberRaw(members, key)
		return ok && !isNull(raw)
	}
	if !present("schema_version") {
		return reject(ReasonMissingField, "schema_version is required")
	}
	version, _ := memberRaw(members, "schema_version")
	if len(version) == 0 || !(version[0] == '-' || version[0] >= '0' && version[0] <= '9') {
		return reject(ReasonInvalidValue, "schema_version must be a number")
	}
	if v, ok := dst.(versioned); ok {
		more, known := v.required(string(version))
		if !known {
			return reject(ReasonUnsupportedVersion, "schema_version %s is not supported", version)
		}
		required = append(slices.Clip(required), more...)
	} else if string(version) != strconv.Itoa(SchemaVersion) {
		return reject(ReasonUnsupportedVersion, "schema_version %s is not supported (this build reads %d)", version, SchemaVersion)
	}
	for _, k := range required {
		if !present(k) {
			return reject(ReasonMissingField, "%s is required", k)
		}
	}
	if mc, ok := dst.(memberChecker); ok {
		if err := mc.checkMembers(members); err != nil {
			return err
		}
	}
	if fd, ok := dst.(fastDecoder); ok && fast && fd.decodeMembers(members) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return reject(ReasonInvalidValue, "%s: %s is not a valid %s", te.Field, te.Value, typeName(te.Type.Kind().String()))
		}
		if strings.HasPrefix(err.Error(), "json: unknown field ") {
			return reject(ReasonUnknownField, "%s", strings.TrimPrefix(err.Error(), "json: "))
		}
		return reject(ReasonInvalidValue, "%v", err)
	}
	return nil
}

// checkEncoding refuses text (what names it in a refusal) that is not
// valid UTF-8, holds a NUL byte, or escapes half of a surrogate pair.
func checkEncoding(text []byte, what string) error {
	if !utf8.Valid(text) {
		return reject(ReasonInvalidEncoding, "%s is not valid UTF-8", what)
	}
	if i := bytes.IndexByte(text, 0); i >= 0 {
		return reject(ReasonInvalidEncoding, "NUL byte at offset %d", i)
	}
	if i, ok := loneSurrogate(text); ok {
		return reject(ReasonInvalidEncoding, "\\u escape at offset %d is half of a UTF-16 surrogate pair: it names no character (decoders would store U+FFFD instead)", i)
	}
	return nil
}

// loneSurrogate finds a \uXXXX escape that is half of a UTF-16 surrogate
// pair without its other half: a high surrogate not followed at once by a
// low one, or a low one on its own. JSON decoders replace it with U+FFFD,
// so accepting it would store something other than what was sent. It
// returns the escape's offset.
//
// Outside strings a backslash is not valid JSON, and inside one it always
// starts a two-character escape, so reading the body's backslashes in
// pairs from the first one never mistakes an escaped backslash followed by
// "u" for an escape.
func loneSurrogate(body []byte) (int, bool) {
	i := bytes.IndexByte(body, '\\')
	if i < 0 {
		return 0, false
	}
	for i < len(body)-1 {
		if body[i] != '\\' {
			i++
			continue
		}
		if body[i+1] != 'u' {
			i += 2
			continue
		}
		r, ok := hex4(body, i+2)
		if !ok {
			return 0, false // not valid JSON: reported as such
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if i+7 < len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
				if lo, ok := hex4(body, i+8); ok && lo >= 0xDC00 && lo < 0xE000 {
					i += 12
					continue
				}
			}
			return i, true
		case r >= 0xDC00 && r < 0xE000:
			return i, true
		}
		i += 6
	}
	return 0, false
}

// hex4 reads four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	return r, true
}

func typeName(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "whole number"
	}
	return kind
}

// walk makes scan's checks on a body that json.Valid accepted, without
// encoding/json's token API (the cost of decoding was mostly there). It
// returns the top-level members in body order.
func walk(body []byte, opaque []string) ([]member, error) {
	w := walker{b: body, members: make([]member, 0, 16)}
	w.space()
	if w.i >= len(w.b) || w.b[w.i] != '{' {
		return nil, reject(ReasonNotJSON, "body must be a JSON object")
	}
	w.i++
	if err := w.object(1, true, true, opaque); err != nil {
		return nil, err
	}
	return w.members, nil
}

// walker reads JSON that is known to be valid.
type walker struct {
	b       []byte
	i       int
	members []member // the members of the object walked with top set
	// grow is how many bytes the numbers walked take more when written
	// out in full (numberWritten); deepest, the deepest level a container
	// reached.
	grow, deepest int
}

// member is one member of an object: its key (unescaped) and the raw text
// of its value.
type member struct {
	key []byte
	raw []byte
	// deepest is the deepest level a container in raw reached (the body's
	// object is level 1; 0: raw is no container), and grow how many bytes
	// its numbers take more written out in full.
	deepest, grow int
}

// memberRaw finds key among ms.
func memberRaw(ms []member, key string) ([]byte, bool) {
	m, ok := memberOf(ms, key)
	return m.raw, ok
}

// memberOf finds key among ms.
func memberOf(ms []member, key string) (member, bool) {
	for _, m := range ms {
		if string(m.key) == key {
			return m, true
		}
	}
	return member{}, false
}

func (w *walker) space() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// str reads a string at w.i (its opening quote) and returns its value:
// the bytes between the quotes when it holds no escape (no copy), else
// the unescaped value.
func (w *walker) str() ([]byte, error) {
	start := w.i
	escaped := false
	w.i++
	for w.b[w.i] != '"' {
		if w.b[w.i] == '\\' {
			escaped = true
			w.i++ // the escaped character; \uXXXX holds no quote
		}
		w.i++
	}
	w.i++
	if !escaped {
		return w.b[start+1 : w.i-1], nil
	}
	var v string
	if err := json.Unmarshal(w.b[start:w.i], &v); err != nil {
		return nil, reject(ReasonNotJSON, "%v", err)
	}
	return []byte(v), nil
}

// object reads an object's members after its '{' and its '}', as
// scanObject does.
func (w *walker) object(depth int, strict, top bool, opaque []string) error {
	var seenBuf [16][]byte
	seen := seenBuf[:0]
	w.space()
	if w.b[w.i] == '}' {
		w.i++
		return nil
	}
	for {
		w.space()
		key, err := w.str()
		if err != nil {
			return err
		}
		if bytes.IndexByte(key, 0) >= 0 {
			return reject(ReasonInvalidEncoding, "a key contains a NUL character")
		}
		if strict && !validKey(string(key)) {
			return reject(ReasonUnknownField, "field %q is not known (fields are lower-case snake_case)", truncate(string(key)))
		}
		for _, k := range seen {
			if bytes.Equal(k, key) {
				return reject(ReasonDuplicateField, "field %q appears twice", key)
			}
		}
		seen = append(seen, key)
		w.space()
		w.i++ // ':'
		w.space()
		childStrict := strict && !(top && slices.Contains(opaque, string(key)))
		start, grew := w.i, w.grow
		if top {
			w.deepest = 0
		}
		if _, err := w.value(depth, childStrict); err != nil {
			return err
		}
		if top {
			w.members = append(w.members, member{key: key, raw: w.b[start:w.i], deepest: w.deepest, grow: w.grow - grew})
		}
		w.space()
		if w.b[w.i] == '}' {
			w.i++
			return nil
		}
		w.i++ // ','
	}
}

// value reads one value, as scanValue does, and reports whether it was
// null.
func (w *walker) value(depth int, strict bool) (bool, error) {
	switch c := w.b[w.i]; c {
	case '{', '[':
		if depth+1 > maxDepth {
			return false, reject(ReasonInvalidValue, "nested deeper than %d levels", maxDepth)
		}
		w.deepest = max(w.deepest, depth+1)
		w.i++
		if c == '{' {
			return false, w.object(depth+1, strict, false, nil)
		}
		w.space()
		if w.b[w.i] == ']' {
			w.i++
			return false, nil
		}
		for {
			w.space()
			if _, err := w.value(depth+1, strict); err != nil {
				return false, err
			}
			w.space()
			if w.b[w.i] == ']' {
				w.i++
				return false, nil
			}
			w.i++ // ','
		}
	case '"':
		v, err := w.str()
		if err != nil {
			return false, err
		}
		if bytes.IndexByte(v, 0) >= 0 {
			return false, reject(ReasonInvalidEncoding, "string contains a NUL character")
		}
		return false, nil
	case 'n':
		w.i += len("null")
		return true, nil
	case 't':
		w.i += len("true")
		return false, nil
	case 'f':
		w.i += len("false")
		return false, nil
	}
	start, exp := w.i, false
	for w.i < len(w.b) && strings.IndexByte("+-0123456789.eE", w.b[w.i]) >= 0 {
		exp = exp || w.b[w.i] == 'e' || w.b[w.i] == 'E'
		w.i++ // a number
	}
	if exp || w.i-start > maxFracDigits {
		written, err := numberWritten(w.b[start:w.i])
		if err != nil {
			return false, err
		}
		w.grow += max(written-(w.i-start), 0)
	}
	return false, nil
}

// scan checks that body is exactly one JSON object with no duplicate keys
// at any depth, only lower-case ASCII keys, no NUL in any string, and
// nesting below maxDepth. It returns the top-level keys whose value is not
// null.
//
// Keys are restricted because encoding/json matches field names without
// regard to case (and folds some non-ASCII letters), which would let
// "Order_ID" or a second spelling of a key slip past the duplicate check.
func scan(body []byte, opaque []string) (map[string]bool, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, reject(ReasonNotJSON, "body is empty")
		}
		return nil, reject(ReasonNotJSON, "%v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, reject(ReasonNotJSON, "body must be a JSON object")
	}
	present := map[string]bool{}
	if err := scanObject(dec, 1, true, present, opaque); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, reject(ReasonTrailingData, "data after the JSON object")
	}
	return present, nil
}

// scanObject reads an object's members after its '{' and its '}'. strict
// asks for snake_case keys. When top is not nil (the top-level object) it
// records the keys whose value is not null, and the values of opaque keys
// are scanned without strict keys.
func scanObject(dec *json.Decoder, depth int, strict bool, top map[string]bool, opaque []string) error {
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return reject(ReasonNotJSON, "%v", err)
		}
		key, ok := tok.(string)
		if !ok {
			return reject(ReasonNotJSON, "object key expected")
		}
		if strings.IndexByte(key, 0) >= 0 {
			return reject(ReasonInvalidEncoding, "a key contains a NUL character")
		}
		if strict && !validKey(key) {
			return reject(ReasonUnknownField, "field %q is not known (fields are lower-case snake_case)", truncate(key))
		}
		if seen[key] {
			return reject(ReasonDuplicateField, "field %q appears twice", key)
		}
		seen[key] = true
		childStrict := strict && !(top != nil && slices.Contains(opaque, key))
		isNull, err := scanValue(dec, depth, childStrict)
		if err != nil {
			return err
		}
		if top != nil && !isNull {
			top[key] = true
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return reject(ReasonNotJSON, "%v", err)
	}
	return nil
}

// scanValue reads one value and reports whether it was null.
func scanValue(dec *json.Decoder, depth int, strict bool) (bool, error) {
	tok, err := dec.Token()
	if err != nil {
		return false, reject(ReasonNotJSON, "%v", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth+1 > maxDepth {
			return false, reject(ReasonInvalidValue, "nested deeper than %d levels", maxDepth)
		}
		switch t {
		case '{':
			return false, scanObject(dec, depth+1, strict, nil, nil)
		case '[':
			for dec.More() {
				if _, err := scanValue(dec, depth+1, strict); err != nil {
					return false, err
				}
			}
			if _, err := dec.Token(); err != nil { // ']'
				return false, reject(ReasonNotJSON, "%v", err)
			}
			return false, nil
		}
		return false, reject(ReasonNotJSON, "unexpected %v", t)
	case string:
		if strings.IndexByte(t, 0) >= 0 {
			return false, reject(ReasonInvalidEncoding, "string contains a NUL character")
		}
	case nil:
		return true, nil
	}
	return false, nil
}

func validKey(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}

// The state store's limits on a number (PostgreSQL's numeric, which jsonb
// keeps numbers in): digits before and after the decimal point.
const (
	maxIntDigits  = 131072
	maxFracDigits = 16383
)

// maxNumberChars bounds what an exponent may make of a number: written out
// in full (as the state store gives it back) it may take this many
// characters, room for every float64, or as many as it was sent with.
const maxNumberChars = 330

// numberWritten returns how many characters a valid JSON number takes
// written out in full, with no exponent, as PostgreSQL writes a numeric
// back (at most: it may drop leading zeros), or why the state store
// cannot hold it or it would grow too much.
func numberWritten(lit []byte) (int, error) {
	s := lit
	sign := 0
	if s[0] == '-' {
		sign, s = 1, s[1:]
	}
	mant, expPart, hasExp := bytes.Cut(s, []byte{'e'})
	if !hasExp {
		mant, expPart, hasExp = bytes.Cut(s, []byte{'E'})
	}
	intPart, fracPart, _ := bytes.Cut(mant, []byte{'.'})
	exp := 0
	if hasExp {
		e := expPart
		neg := false
		if len(e) > 0 && (e[0] == '+' || e[0] == '-') {
			neg, e = e[0] == '-', e[1:]
		}
		for _, c := range e {
			exp = exp*10 + int(c-'0')
			if exp > 1<<24 {
				break // far past any limit below
			}
		}
		if neg {
			exp = -exp
		}
	}
	intDigits := max(len(intPart)+exp, 1)
	fracDigits := max(len(fracPart)-exp, 0)
	if intDigits > maxIntDigits || fracDigits > maxFracDigits {
		return 0, reject(ReasonInvalidValue, "number %s is beyond what the state store holds (%d digits before the point, %d after)",
			truncate(string(lit)), maxIntDigits, maxFracDigits)
	}
	written := sign + intDigits
	if fracDigits > 0 {
		written += 1 + fracDigits
	}
	if written > max(maxNumberChars, len(lit)) {
		return 0, reject(ReasonInvalidValue, "number %s would be %d digits long written out; write it with at most %d",
			truncate(string(lit)), written, maxNumberChars)
	}
	return written, nil
}

// CheckJSON checks raw, a JSON value a message carries as one of its
// fields (a payload), by the rules every decoder of this package applies
// to a message and the state store to what it keeps: valid UTF-8 with no
// NUL byte and no half of a surrogate pair, valid JSON, no key twice in
// an object, nested no deeper than the message allows, no NUL in a
// string, numbers the store can hold that an exponent does not make
// longer than 330 characters; and, written out as the store gives it back
// (numbers in full), at most maxBytes. A client checks a payload with it
// so that what it sends is never refused further on. The error is a
// *DecodeError.
func CheckJSON(raw []byte, maxBytes int) error { return checkJSON(raw, maxBytes, 1) }

// memberChecker is a message whose free-form members must meet more than
// the body's rules; checkMembers sees them as the walk found them, which
// is what the same checks on the member alone would find.
type memberChecker interface {
	checkMembers(ms []member) error
}

// CheckResult is CheckJSON for a step's result: every later request
// carries it one level deeper (in results, by action name), so it may be
// nested one level less. An agent checks a service's answer with it, and
// the reply decoder holds a result to the same, so that no reply an agent
// sends is refused by a scheduler and no result makes a later request
// unreadable.
func CheckResult(raw []byte, maxBytes int) error { return checkJSON(raw, maxBytes, 2) }

// checkJSON is CheckJSON for a value at depth (1: a member of a message's
// object).
func checkJSON(raw []byte, maxBytes, depth int) error {
	if err := checkEncoding(raw, "value"); err != nil {
		return err
	}
	if !json.Valid(raw) {
		return reject(ReasonNotJSON, "not valid JSON")
	}
	w := walker{b: raw}
	w.space()
	if _, err := w.value(depth, false); err != nil {
		return err
	}
	if n := len(raw) + w.grow; n > maxBytes {
		if w.grow > 0 {
			return reject(ReasonTooLarge, "%d bytes with its numbers written out in full, limit %d", n, maxBytes)
		}
		return reject(ReasonTooLarge, "%d bytes, limit %d", n, maxBytes)
	}
	return nil
}
