package messages_test

import (
	"reflect"
	"strings"
	"testing"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
)

// sameBothWays decodes body with and without the fast path and fails on
// any difference in the message or the error.
func sameBothWays[T any](t *testing.T, body []byte, decode func([]byte, bool) (T, error)) {
	t.Helper()
	fast, fastErr := decode(body, true)
	slow, slowErr := decode(body, false)
	if (fastErr == nil) != (slowErr == nil) || fastErr != nil && fastErr.Error() != slowErr.Error() {
		t.Fatalf("%s:\nfast path: %v\nencoding/json: %v", body, fastErr, slowErr)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("%s:\nfast path: %#v\nencoding/json: %#v", body, fast, slow)
	}
}

func checkAllWays(t *testing.T, body []byte) {
	t.Helper()
	sameBothWays(t, body, messages.DecodeSubmitOrderWith)
	sameBothWays(t, body, messages.DecodeStepRequestWith)
	sameBothWays(t, body, messages.DecodeStepReplyWith)
	sameBothWays(t, body, messages.DecodeStatusEventWith)
}

// fastDecodeSeeds are bodies of every message with the value forms the
// fast path reads and the ones it leaves to encoding/json.
func fastDecodeSeeds() []string {
	id := fuzzID
	request := `{"schema_version":1,"order_id":"` + id + `","step":2,"name":"charge_payment","agent":"payment","attempt":3,` +
		`"idempotency_key":"` + id + `/2/charge_payment","complete_by":"2030-01-01T00:00:00.123456Z",` +
		`"payload":{"customer":"c","items":[{"sku":"a","qty":1},{"sku":"b","qty":2}],"amount":1,"currency":"EUR"},"undoes":"k"}`
	reply := `{"schema_version":1,"order_id":"` + id + `","step":1,"attempt":1,"outcome":"ok","result":{"X":[1,{"y":null}]},` +
		`"started_at":"2030-01-01T00:00:00Z","call_us":1234,"sent_at":"2030-01-01T00:00:00.5+02:00"}`
	seeds := []string{
		badinput.ValidSubmitJSON(id),
		`{"schema_version":1,"order_id":"` + strings.ToUpper(id) + `","customer":"Zoë","items":[{"sku":"a","qty":1}],"amount":0,"currency":"USD","priority":9,"reply_to":"q","workflow":"w","placed_at":"2030-01-01T00:00:00Z"}`,
		request,
		reply,
		`{"schema_version":1,"order_id":"` + id + `","step":2,"attempt":4,"outcome":"failed","error":"declined"}`,
		`{"schema_version":1,"order_id":"` + id + `","status":"completed","step":null,"at":"2030-01-01T00:00:00Z"}`,
		`{"schema_version":1,"order_id":"` + id + `","status":"error","step":2,"at":"2030-01-01T00:00:00.5Z"}`,
	}
	// Forms the fast path gives up on, and values of the wrong type.
	variants := []struct{ old, new string }{
		{`"step":2`, `"step":2.0`},
		{`"step":2`, `"step":2e0`},
		{`"step":2`, `"step":"2"`},
		{`"step":2`, `"step":99999999999999999999`},
		{`"step":2`, `"step":null`},
		{`"step":1`, `"step":-1`},
		{`"step":1`, `"step":true`},
		{`"attempt":1`, `"attempt":{}`},
		{`"outcome":"ok"`, `"outcome":"\u006fk"`},
		{`"outcome":"ok"`, `"outcome":null`},
		{`"outcome":"failed"`, `"outcome":"failed","result":null`},
		{`"result":{"X":[1,{"y":null}]}`, `"result":null`},
		{`"result":{"X":[1,{"y":null}]}`, `"result":"text"`},
		{`"error":"declined"`, `"error":"line\nbreak"`},
		{`"error":"declined"`, `"error":["x"]`},
		{`"call_us":1234`, `"call_us":1234.5`},
		{`"call_us":1234`, `"call_us":null`},
		{`"started_at":"2030-01-01T00:00:00Z"`, `"started_at":null`},
		{`"started_at":"2030-01-01T00:00:00Z"`, `"started_at":"yesterday"`},
		{`"started_at":"2030-01-01T00:00:00Z"`, `"started_at":5`},
		{`"sent_at":"2030-01-01T00:00:00.5+02:00"`, `"sent_at":"2030-01-01T00:00:00\u002e5Z"`},
		{`"at":"2030-01-01T00:00:00Z"`, `"at":null`},
		{`"at":"2030-01-01T00:00:00Z"`, `"at":"2030-01-01 00:00:00Z"`},
		{`"complete_by":"2030-01-01T00:00:00.123456Z"`, `"complete_by":"2030-13-01T00:00:00Z"`},
		{`"payload":{`, `"payload":null,"x":{`},
		{`"payload":{`, `"payload":[],"x":{`},
		{`"customer":"c"`, `"customer":"c","discount":1`},
		{`"items":[{"sku":"a","qty":1}`, `"items":[null`},
		{`"items":[{"sku":"a","qty":1}`, `"items":[[]`},
		{`"items":[{"sku":"a","qty":1}`, `"items":[{"sku":"a","qty":1,"colour":"red"}`},
		{`"items":[{"sku":"a","qty":1}`, `"items":[{"sku":"\u0061","qty":1.5}`},
		{`"items":[{"sku":"a","qty":1}`, `"items":[ { "sku" : "a" , "qty" : 1 } `},
		{`"amount":1`, `"amount":-0`},
		{`"currency":"EUR"`, `"currency":null`},
		{`"undoes":"k"`, `"undoes":7`},
		{`"status":"completed"`, `"status":"completed","extra":1`},
		{`"schema_version":1,`, `"schema_version":1, "priority" : 3 ,`},
		{`"priority":9`, `"priority":10`},
		{`"placed_at":"2030-01-01T00:00:00Z"`, `"placed_at":null`},
		{`"reply_to":"q"`, `"reply_to":""`},
	}
	n := len(seeds)
	for _, s := range seeds[:n] {
		for _, v := range variants {
			if strings.Contains(s, v.old) {
				seeds = append(seeds, strings.Replace(s, v.old, v.new, 1))
			}
		}
	}
	return seeds
}

// TestFastDecodeMatchesJSON: on every seed, the fast path decodes to the
// very message (or the very error) encoding/json does.
func TestFastDecodeMatchesJSON(t *testing.T) {
	t.Parallel()
	seeds := fastDecodeSeeds()
	for _, c := range badinput.SubmitOrders(fixedID) {
		seeds = append(seeds, string(c.Body))
	}
	for _, c := range badinput.StepReplies(fixedID) {
		seeds = append(seeds, string(c.Body))
	}
	for _, s := range seeds {
		checkAllWays(t, []byte(s))
	}
}

func FuzzFastDecodeMatchesJSON(f *testing.F) {
	for _, s := range fastDecodeSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkAllWays(t, body) })
}
