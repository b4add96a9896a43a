package workflow

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// PayloadError says where a payload first breaks its workflow's schema.
type PayloadError struct {
	// Pointer is the JSON Pointer (RFC 6901) of the offending value; ""
	// is the payload itself.
	Pointer string
	Detail  string
}

func (e *PayloadError) Error() string {
	at := e.Pointer
	if at == "" {
		at = "/"
	}
	return "payload at " + at + ": " + e.Detail
}

// HasSchema reports whether the workflow declares a payload schema.
func (wf Workflow) HasSchema() bool { return wf.schema != nil }

// CheckPayload checks a payload (a JSON object) against the workflow's
// schema, if it declares one, and returns a *PayloadError for the first
// violation.
func (wf Workflow) CheckPayload(payload []byte) error {
	if wf.schema == nil {
		return nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &PayloadError{Detail: "not JSON: " + err.Error()}
	}
	return wf.CheckPayloadValue(v)
}

// CheckPayloadValue is CheckPayload for a payload already decoded with
// numbers as json.Number (messages.PayloadValue).
//
// A payload whose check would take more than MaxSchemaSteps evaluations
// is refused, with that reason, before any: a submitter never spends more
// than a bounded time on one payload, whatever the schema and payload.
func (wf Workflow) CheckPayloadValue(v any) error {
	if wf.schema == nil {
		return nil
	}
	if wf.schemaCost != nil && !wf.schemaCost.within(v, MaxSchemaSteps) {
		return &PayloadError{Detail: fmt.Sprintf("checking it against the workflow's schema would take more than %d steps "+
			"(the schema applies itself to this payload's values too many ways, as a recursive anyOf or oneOf does at every level of nesting): "+
			"nest it less, or simplify the schema", MaxSchemaSteps)}
	}
	err := wf.schema.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &PayloadError{Detail: err.Error()}
	}
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	var ptr strings.Builder
	for _, tok := range ve.InstanceLocation {
		ptr.WriteByte('/')
		ptr.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(tok))
	}
	return &PayloadError{Pointer: ptr.String(), Detail: ve.ErrorKind.LocalizedString(message.NewPrinter(language.English))}
}
