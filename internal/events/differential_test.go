package events

import (
	"regexp"
	"strings"
	"testing"
)

// trickyRecords are records on the edges where a hand-written scanner and
// encoding/json could part ways: escapes and surrogates in keys and values,
// the duplicate-key set past its in-place capacity, number grammar,
// literals, top-level scalars followed by junk, and where each error is
// found when a record is broken twice.
var trickyRecords = func() []string {
	const (
		id    = `"event_id":"01a2272d-2600-7b1a-9c3d-2e4f6a8b0c1d"`
		typ   = `"event_type":"order.confirmed.v1"`
		at    = `"occurred_at":"2026-11-29T12:00:00Z"`
		ids   = `"order_id":1001,"customer_id":42`
		total = `"total_amount":"99.90"`
	)
	valid := func(extra string) string {
		return "{" + id + "," + typ + "," + at + "," + ids + "," + total + extra + "}"
	}
	many := ""
	for i := range 20 {
		many += `,"k` + string(rune('a'+i)) + `":1`
	}
	return []string{
		valid(""),
		valid(`,"\ud800":1,"\udc00":2`),         // both U+FFFD: duplicate
		valid(`,"\ud83d\ude00":1,"😀":2`),        // a pair is the rune: duplicate
		valid(`,"\ud83d\u0041":1,"\ufffdA":2`),  // mismatched pair: duplicate
		valid(`,"\ud83d\ud83d\ude00":1`),        // high, then a pair
		valid(`,"a\/b":1,"a/b":2`),              // duplicate
		valid(`,"\u0000":1,"\u0000":2`),         // duplicate
		valid(`,"\b\f\n\r\t\"\\":1`),            // every short escape
		valid(many),                             // the set moves to a map
		valid(many + `,"kc":3`),                 // a duplicate found in the map
		valid(`,"kb":0` + many),                 // a duplicate found in place
		valid(`,"x":{"a":1,"a":2}`),             // nested duplicates are fine
		valid(`,"total_amoun\u0074":"9999.00"`), // a known key repeated through an escape
		valid(`,"total_amount":null`), `{"total_amount":null,` + id + "," + typ + "," + at + "," + ids + "," + total + "}",
		valid(`,"x":` + strings.Repeat("[", 31) + strings.Repeat("]", 31)), // the record's 32nd level
		valid(`,"x":` + strings.Repeat("[", 32) + strings.Repeat("]", 32)), // the 33rd
		valid(`,"x":` + strings.Repeat(`{"a":`, 31) + "1" + strings.Repeat("}", 31)),
		valid(`,"x":` + strings.Repeat(`{"a":`, 32) + "1" + strings.Repeat("}", 32)),
		valid(`,"x":` + strings.Repeat(`[{"a":`, 15) + "1" + strings.Repeat("}]", 15)),
		valid(`,"x":` + strings.Repeat(`[{"a":`, 16) + "1" + strings.Repeat("}]", 16)),
		valid(`,"x":[1,-0,0.5,1e3,1E+3,2e-3,-12.5e10,true,false,null,"",{},[]]`),
		valid(`,"x":01`), valid(`,"x":1.`), valid(`,"x":-`), valid(`,"x":1e`), valid(`,"x":1e+`),
		valid(`,"x":.5`), valid(`,"x":+1`), valid(`,"x":tru`), valid(`,"x":nul`), valid(`,"x":falsey`),
		valid(`,"x":"\x"`), valid(`,"x":"\u12g4"`), valid(`,"x":"\u12"`), valid("\t,\n\"x\"\r:\t1 "),
		valid(`,"x":"` + "\x01" + `"`), valid(`,"x":[1,]`), valid(`,"x":{"a":1,}`), valid(`,"x":{"a"}`),
		valid(`,"x":{1:2}`), valid(`,"x":[1 2]`), valid(`,"x":{"a":1 "b":2}`), valid(`,"x":}`),
		valid(`,`), valid(`,,"x":1`), valid(` "x":1`),
		`{"event_id":"01a2272d-2600-7b1a-9c3d-2e4f6a8b0c1d","event_id":` + "\x01", // duplicate before the junk
		`{"x":` + strings.Repeat("[", 40) + "\x01",                                // depth before the junk
		`{"a":1,"a"`, `{"a":1,"a" x`, // a duplicate key is found before its colon
		`{"\u0065vent_id":"\u0030\u0031a2272d-2600-7b1a-9c3d-2e4f6a8b0c1d",` + typ + "," + at + "," + ids + "," + total + "}",
		`{` + id + `,"event_type":"order\u002econfirmed.v1",` + at + "," + ids + `,"total_amount":"\u0039\u0039.90"}`,
		`{` + id + `,"event_type":"order.confirmed.v1\u0000",` + at + "," + ids + "," + total + "}",
		`{` + id + "," + typ + `,"occurred_at":"2026-11-29T12:00:00\u005a",` + ids + "," + total + "}",
		`{` + id + "," + typ + `,"occurred_at":"0000-01-01T00:00:00+01:00",` + ids + "," + total + "}", // year -1 in UTC
		`{` + id + "," + typ + "," + at + `,"order_id":-0,"customer_id":1e2,` + total + "}",
		`{` + id + "," + typ + "," + at + `,"order_id":"1001","customer_id":42,` + total + "}",
		`{` + id + "," + typ + "," + at + `,"order_id":1001.0,"customer_id":9223372036854775807,` + total + "}",
		`{` + id + "," + typ + "," + at + `,"order_id":1001,"customer_id":9223372036854775808,` + total + "}",
		`{` + id + "," + typ + "," + at + "," + ids + `,"total_amount":99.9e0}`,
		`{` + id + "," + typ + "," + at + "," + ids + `,"total_amount":-1}`,
		`{` + id + "," + typ + "," + at + "," + ids + `,"Total_Amount":"1.00"}`,
		`{}`, `{ }`, `{"a":1}`, `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a`, `{"a\`, `{"a\u00`, `{`, ` `,
		`123abc`, `truex`, `"a"x`, `"a`, `-`, `1.`, `]`, `}`, `,`, `:`, `[`, `[1,`, `x`, `'a'`, `nul`,
		`"\ud800"`, "\xef\xbb\xbf{}", `{}{}`, `{} x`, "{}\x00", `{"a":1}}`,
	}
}()

// TestDecodeMatchesOracle runs the tricky records through both decoders.
func TestDecodeMatchesOracle(t *testing.T) {
	for _, r := range trickyRecords {
		compareWithOracle(t, []byte(r))
	}
}

// FuzzAgainstOldDecoder checks that the one-pass scanner decides every
// record as the decoder it replaced did (oracle_test.go): the same event,
// or an error on the same field with the same reason (see sameReason for
// the two ways a syntax error's text may differ).
func FuzzAgainstOldDecoder(f *testing.F) {
	addFixtureSeeds(f)
	for _, r := range trickyRecords {
		f.Add([]byte(r))
	}
	f.Fuzz(func(t *testing.T, value []byte) { compareWithOracle(t, value) })
}

func compareWithOracle(t *testing.T, value []byte) {
	t.Helper()
	got, gerr := decode(value, testNow)
	want, werr := oracleDecode(value, testNow)
	switch {
	case gerr == nil && werr == nil:
		if got != want {
			t.Errorf("%q: decoded\n %+v\nthe old decoder\n %+v", value, got, want)
		}
	case gerr == nil:
		t.Errorf("%q: accepted as %+v; the old decoder said %v", value, got, werr)
	case werr == nil:
		t.Errorf("%q: refused with %v; the old decoder accepted %+v", value, gerr, want)
	case gerr.Field != werr.Field || !sameReason(gerr.Reason, werr.Reason):
		t.Errorf("%q:\n got  %v\n want %v (the old decoder)", value, gerr, werr)
	}
}

// sameReason compares reasons, ignoring the byte offset of a syntax error
// (Decoder.Token's were one or two bytes off inside a value; ours is the
// index of the offending byte) and allowing a description the old one
// lacked (Decoder.Token gave none for a non-string right after '{').
func sameReason(got, want string) bool {
	got = malformedAt.ReplaceAllString(got, "at byte N:")
	want = malformedAt.ReplaceAllString(want, "at byte N:")
	return got == want || strings.HasPrefix(want, "malformed JSON") && strings.HasPrefix(got, want+" ")
}

var malformedAt = regexp.MustCompile(`at byte [0-9]+:`)
