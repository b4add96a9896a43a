package workflow

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
// violation (Schema.Check).
func (wf Workflow) CheckPayload(payload []byte) error {
	if wf.schema == nil {
		return nil
	}
	return wf.schema.Check(payload)
}

// CheckOrderPayload is the workflow's whole rule for an order's payload,
// wherever one comes from (a submit on any entrance, a re-run, a child, a
// schedule of the file): its schema (CheckPayload), then its payload-only
// for_each lists (CheckForEach).
func (wf Workflow) CheckOrderPayload(payload []byte) error {
	if err := wf.CheckPayload(payload); err != nil {
		return err
	}
	return wf.CheckForEach(payload)
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
	return wf.schema.CheckValue(v)
}
