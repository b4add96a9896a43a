package messages

import (
	"bytes"
	"encoding/json"
	"maps"
	"strings"
	"testing"
)

// FuzzWalkMatchesScan: on every body json.Valid accepts, the fast walker
// finds exactly what the token-based scan finds: the same error reason,
// or the same top-level keys.
func FuzzWalkMatchesScan(f *testing.F) {
	f.Add([]byte(`{"schema_version":1,"order_id":"6f1c2d1e-8a55-4e51-9d87-3b2a1c0e9f10","customer":"ACME Ltd",` +
		`"items":[{"sku":"SKU-1","qty":2}],"amount":1999,"currency":"EUR","priority":7,"placed_at":"2026-11-21T10:00:00Z"}`))
	f.Add([]byte(`{"schema_version":1,"Order_ID":"x"}`))
	f.Add([]byte(`{"schema_version":1,"a":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`))
	f.Add([]byte(`{"schema_version":1,"a":{"b":[1,{"c":null}],"d":"\u0000"}}`))
	f.Add([]byte(`{"schema_version":1,"result":{"Mixed":"x","k\u0065y":[true,false,-1.5e3]},"x":"\"}"}`))
	f.Add([]byte(` { "schema_version" : 1 , "a\u005fb" : [ ] , "c" : { } } `))
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Add([]byte(`[1]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) || bytes.IndexByte(body, 0) >= 0 {
			return
		}
		opaque := []string{"result"}
		slow, slowErr := scan(body, opaque)
		members, fastErr := walk(body, opaque)
		fast := map[string]bool{}
		for _, m := range members {
			if !isNull(m.raw) {
				fast[string(m.key)] = true
			}
		}
		if (slowErr == nil) != (fastErr == nil) {
			t.Fatalf("%q: scan %v, walk %v", body, slowErr, fastErr)
		}
		if slowErr != nil {
			s, _ := AsDecodeError(slowErr)
			w, _ := AsDecodeError(fastErr)
			if s.Reason != w.Reason {
				t.Fatalf("%q: scan %v, walk %v", body, slowErr, fastErr)
			}
			return
		}
		if !maps.Equal(slow, fast) {
			t.Fatalf("%q: scan keys %v, walk keys %v", body, slow, fast)
		}
	})
}
