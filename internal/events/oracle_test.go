package events

// The decoder this package had before issue 14, kept verbatim (renamed
// oracle*) as the oracle of FuzzAgainstOldDecoder: a token walk with
// encoding/json's Decoder.Token and UseNumber, ~80 allocations per event.
// It shares the unchanged helpers (uuidTime, rfc3339Shape, amountReason,
// canonicalUUIDLen) with decode.go. Do not "fix" it: it defines what the
// new scanner must agree with.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/money"
)

func oracleDecode(value []byte, now time.Time) (OrderConfirmed, *ValidationError) {
	var e OrderConfirmed
	if len(value) > MaxValueBytes {
		return e, &ValidationError{Reason: fmt.Sprintf("value larger than %d bytes", MaxValueBytes)}
	}
	// encoding/json would silently replace invalid UTF-8 with U+FFFD.
	if !utf8.Valid(value) {
		return e, &ValidationError{Reason: "not valid UTF-8"}
	}
	m, verr := oracleScanObject(value)
	if verr != nil {
		return e, verr
	}
	horizon := now.Add(MaxFutureSkew)

	if e.EventID, verr = oracleEventID(m, horizon); verr != nil {
		return e, verr
	}
	typ, verr := oracleStr(m, "event_type")
	if verr != nil {
		return e, verr
	}
	if typ != EventType {
		return e, &ValidationError{"event_type", fmt.Sprintf("%.40q is not %q", typ, EventType)}
	}
	e.EventType = EventType
	if e.OccurredAt, verr = oracleOccurredAt(m, horizon); verr != nil {
		return e, verr
	}
	if e.OrderID, verr = oraclePositiveInt(m, "order_id"); verr != nil {
		return e, verr
	}
	if e.CustomerID, verr = oraclePositiveInt(m, "customer_id"); verr != nil {
		return e, verr
	}
	if e.TotalAmount, verr = oracleAmount(m, "total_amount"); verr != nil {
		return e, verr
	}
	return e, nil
}

func oracleEventID(m map[string]json.Token, horizon time.Time) (uuid.UUID, *ValidationError) {
	const field = "event_id"
	s, verr := oracleStr(m, field)
	if verr != nil {
		return uuid.Nil, verr
	}
	if len(s) != canonicalUUIDLen {
		return uuid.Nil, &ValidationError{field, "not a UUID in the 8-4-4-4-12 hyphenated form"}
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, &ValidationError{field, "not a UUID in the 8-4-4-4-12 hyphenated form"}
	}
	if id.Version() != 7 {
		return uuid.Nil, &ValidationError{field, fmt.Sprintf("UUID version is %d, want 7", id.Version())}
	}
	if id.Variant() != uuid.RFC4122 {
		return uuid.Nil, &ValidationError{field, fmt.Sprintf("UUID variant is %v, want RFC 4122", id.Variant())}
	}
	if uuidTime(id).After(horizon) {
		return uuid.Nil, &ValidationError{field, "UUIDv7 time is more than 24h ahead of the consumer's clock"}
	}
	return id, nil
}

func oracleOccurredAt(m map[string]json.Token, horizon time.Time) (time.Time, *ValidationError) {
	const field = "occurred_at"
	s, verr := oracleStr(m, field)
	if verr != nil {
		return time.Time{}, verr
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !rfc3339Shape(s) {
		return time.Time{}, &ValidationError{field, "not an RFC 3339 timestamp with offset"}
	}
	// A rule added to both decoders after the fuzzer found year -1 in UTC
	// (testdata/fuzz/FuzzDecode/bbe1075727b91079).
	if t.UTC().Year() < 0 {
		return time.Time{}, &ValidationError{field, "before year 0000 in UTC"}
	}
	if t.After(horizon) {
		return time.Time{}, &ValidationError{field, "more than 24h ahead of the consumer's clock"}
	}
	return t.UTC(), nil
}

// positiveInt reads a JSON integer in 1..math.MaxInt64. The number's text is
// parsed as an integer, so 1.0, 1e3 and 9223372036854775808 are rejected
// instead of being rounded through float64.
func oraclePositiveInt(m map[string]json.Token, field string) (int64, *ValidationError) {
	tok, verr := oracleMember(m, field)
	if verr != nil {
		return 0, verr
	}
	n, ok := tok.(json.Number)
	if !ok {
		return 0, &ValidationError{field, "must be a JSON integer, not " + oracleKindOf(tok)}
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, &ValidationError{field, "out of the 64-bit integer range"}
	case err != nil:
		return 0, &ValidationError{field, "must be an integer without fraction or exponent"}
	case v < 1:
		return 0, &ValidationError{field, "must be positive"}
	}
	return v, nil
}

// amount reads a JSON string or number and parses its exact text with
// money.ParseAmount, so 99.9 and "99.90" are both 9990 and nothing is ever
// a float64.
func oracleAmount(m map[string]json.Token, field string) (money.Amount, *ValidationError) {
	tok, verr := oracleMember(m, field)
	if verr != nil {
		return 0, verr
	}
	var text string
	switch v := tok.(type) {
	case string:
		text = v
	case json.Number:
		text = string(v)
	default:
		return 0, &ValidationError{field, "must be a JSON string or number, not " + oracleKindOf(tok)}
	}
	a, err := money.ParseAmount(text)
	if err != nil {
		return 0, &ValidationError{field, amountReason(err)}
	}
	return a, nil
}

// str reads a member that must be a JSON string.
func oracleStr(m map[string]json.Token, field string) (string, *ValidationError) {
	tok, verr := oracleMember(m, field)
	if verr != nil {
		return "", verr
	}
	s, ok := tok.(string)
	if !ok {
		return "", &ValidationError{field, "must be a JSON string, not " + oracleKindOf(tok)}
	}
	return s, nil
}

// member returns a present, non-null member: null counts as missing.
func oracleMember(m map[string]json.Token, field string) (json.Token, *ValidationError) {
	tok, ok := m[field]
	if !ok || tok == nil {
		return nil, &ValidationError{field, "missing"}
	}
	return tok, nil
}

// kindOf names the JSON type of a scanObject member for error messages.
func oracleKindOf(tok json.Token) string {
	switch v := tok.(type) {
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case json.Delim:
		if v == '[' {
			return "an array"
		}
		return "an object"
	}
	return "null"
}

// frame is one open container of the token walk.
type oracleFrame struct {
	object  bool // an object, not an array
	wantKey bool // in an object: the next token is a key or '}'
}

// scanObject reads a JSON object with one iterative token pass and returns
// its top-level members: for a scalar member the token itself (string,
// json.Number, bool or nil), for an object or array member its opening
// json.Delim. Nested values are checked for syntax and depth, then dropped.
//
// It exists instead of json.Unmarshal into a struct because Unmarshal keeps
// the last of duplicate keys and matches keys case-insensitively: both would
// let {"total_amount":"1.00","TOTAL_AMOUNT":"9999.00"} charge an amount
// other readers of the record do not see. Here keys match exactly (a
// differently cased key is an unknown field, ignored) and a repeated
// top-level key is an error. Numbers stay json.Number text, never float64.
func oracleScanObject(value []byte) (map[string]json.Token, *ValidationError) {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()

	tok, err := dec.Token()
	if err == io.EOF {
		return nil, &ValidationError{Reason: "empty value"}
	}
	if err != nil {
		return nil, oracleMalformed(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, &ValidationError{Reason: "not a JSON object"}
	}

	members := make(map[string]json.Token)
	stack := []oracleFrame{{object: true, wantKey: true}}
	var key string // the current top-level key
	for len(stack) > 0 {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil, &ValidationError{Reason: "malformed JSON: unexpected end of input"}
		}
		if err != nil {
			return nil, oracleMalformed(err)
		}
		top := &stack[len(stack)-1]
		if top.object && top.wantKey {
			if _, ok := tok.(json.Delim); ok { // '}': the decoder allows nothing else
				stack = stack[:len(stack)-1]
				oracleValueDone(stack)
				continue
			}
			k, _ := tok.(string) // the decoder only returns strings in key position
			if len(stack) == 1 {
				if _, dup := members[k]; dup {
					return nil, &ValidationError{Reason: fmt.Sprintf("duplicate key %.64q", k)}
				}
				key = k
			}
			top.wantKey = false
			continue
		}
		switch d, _ := tok.(json.Delim); d {
		case '{', '[':
			if len(stack) == 1 {
				members[key] = d
			}
			if len(stack) >= maxDepth {
				return nil, &ValidationError{Reason: "nested deeper than 32 levels"}
			}
			stack = append(stack, oracleFrame{object: d == '{', wantKey: d == '{'})
		case ']':
			stack = stack[:len(stack)-1]
			oracleValueDone(stack)
		default: // a scalar value
			if len(stack) == 1 {
				members[key] = tok
			}
			oracleValueDone(stack)
		}
	}

	// One record is one JSON value: trailing data means a producer bug or
	// two records glued together, either way not something to charge.
	if _, err := dec.Token(); err != io.EOF {
		return nil, &ValidationError{Reason: "data after the JSON object"}
	}
	return members, nil
}

// valueDone records that a value ended inside the innermost open container.
func oracleValueDone(stack []oracleFrame) {
	if n := len(stack); n > 0 && stack[n-1].object {
		stack[n-1].wantKey = true
	}
}

// malformed turns a decoder error into a record-level ValidationError.
func oracleMalformed(err error) *ValidationError {
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &syn):
		return &ValidationError{Reason: fmt.Sprintf("malformed JSON at byte %d: %s", syn.Offset, syn)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &ValidationError{Reason: "malformed JSON: unexpected end of input"}
	}
	return &ValidationError{Reason: "malformed JSON"}
}
