package workflow

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// MaxSchemaDetailBytes bounds what a refusal says of a document that breaks
// its schema: the first violation, in the validator's words (which may quote
// the document), cut to fit.
const MaxSchemaDetailBytes = 500

// Schema is a compiled JSON Schema with the bound on its work. Every JSON
// document from outside that a schema governs (a submit's payload, a
// re-run's, a child's, a signal's) is checked through Check: refused at
// once, with that reason, when checking it would take more than
// MaxSchemaSteps evaluations, and otherwise refused with its first
// violation, a bounded text, never the validator's whole error tree.
type Schema struct {
	raw  json.RawMessage
	sch  *jsonschema.Schema
	cost *schemaCost
}

// CompileSchema compiles a JSON Schema (2020-12 unless its $schema says
// otherwise; no reference outside the document).
func CompileSchema(raw []byte) (*Schema, error) {
	sch, err := compileSchema(raw)
	if err != nil {
		return nil, err
	}
	return &Schema{raw: bytes.Clone(raw), sch: sch, cost: newSchemaCost(sch)}, nil
}

// Raw is the schema as JSON.
func (s *Schema) Raw() json.RawMessage { return s.raw }

// Check checks doc, a JSON document, against the schema: nil, or a
// *PayloadError saying where it first breaks it (or that it is not JSON,
// or too costly to check).
func (s *Schema) Check(doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return &PayloadError{Detail: boundDetail("not JSON: " + err.Error())}
	}
	return s.CheckValue(v)
}

// CheckValue is Check for a document decoded already, with numbers as
// json.Number (messages.PayloadValue).
func (s *Schema) CheckValue(v any) error {
	if !s.cost.within(v, MaxSchemaSteps) {
		return &PayloadError{Detail: fmt.Sprintf("checking it against its schema would take more than %d steps "+
			"(the schema applies itself to this document's values too many ways, as a recursive anyOf or oneOf does at every level of nesting): "+
			"nest it less, or simplify the schema", MaxSchemaSteps)}
	}
	err := s.sch.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &PayloadError{Detail: boundDetail(err.Error())}
	}
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	var ptr strings.Builder
	for _, tok := range ve.InstanceLocation {
		ptr.WriteByte('/')
		ptr.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(tok))
	}
	pointer := ptr.String()
	if len(pointer) > 200 {
		pointer = boundDetailTo(pointer, 200)
	}
	return &PayloadError{Pointer: pointer, Detail: boundDetail(ve.ErrorKind.LocalizedString(message.NewPrinter(language.English)))}
}

// boundDetail makes a validator's words fit a refusal: one line of valid
// UTF-8 without control characters, at most MaxSchemaDetailBytes.
func boundDetail(s string) string { return boundDetailTo(s, MaxSchemaDetailBytes) }

func boundDetailTo(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Schemas compiles the schemas a service meets in stored definitions (a
// wait's, kept in its step) once each, by their text, and keeps at most
// max of them; past that, it starts again. Safe for concurrent use.
type Schemas struct {
	mu    sync.Mutex
	max   int
	cache map[[32]byte]*Schema
}

// NewSchemas returns an empty cache of at most max compiled schemas.
func NewSchemas(max int) *Schemas {
	return &Schemas{max: max, cache: map[[32]byte]*Schema{}}
}

// Get returns raw compiled.
func (c *Schemas) Get(raw []byte) (*Schema, error) {
	k := sha256.Sum256(raw)
	c.mu.Lock()
	s, ok := c.cache[k]
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	s, err := CompileSchema(raw)
	if err != nil {
		return nil, fmt.Errorf("the schema cannot be compiled: %s", boundDetail(oneLine(err.Error())))
	}
	c.mu.Lock()
	if len(c.cache) >= c.max {
		clear(c.cache)
	}
	c.cache[k] = s
	c.mu.Unlock()
	return s, nil
}
