package events

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// Decode parses and validates one record value against SPEC §4, judging
// "too far in the future" against now (the consumer's clock, passed in so
// that tests and replays are deterministic).
//
// Every error it returns has kind fault.Invalid (the record can never
// succeed: DLQ "invalid") and wraps a *ValidationError naming the first
// broken rule; fields are checked in the order of OrderConfirmed. Unknown
// fields are ignored; a missing, null or mistyped field is invalid. Decode
// does not retain value and is safe for concurrent use.
func Decode(value []byte, now time.Time) (OrderConfirmed, error) {
	e, verr := decode(value, now)
	if verr != nil {
		return OrderConfirmed{}, fault.New(fault.Invalid, verr)
	}
	return e, nil
}

func decode(value []byte, now time.Time) (OrderConfirmed, *ValidationError) {
	var e OrderConfirmed
	if len(value) > MaxValueBytes {
		return e, &ValidationError{Reason: fmt.Sprintf("value larger than %d bytes", MaxValueBytes)}
	}
	// encoding/json would silently replace invalid UTF-8 with U+FFFD.
	if !utf8.Valid(value) {
		return e, &ValidationError{Reason: "not valid UTF-8"}
	}
	var rec record
	if verr := scanRecord(value, &rec); verr != nil {
		return e, verr
	}
	horizon := now.Add(MaxFutureSkew)

	var verr *ValidationError
	if e.EventID, verr = eventID(&rec, horizon); verr != nil {
		return e, verr
	}
	typ, verr := str(&rec, fieldEventType)
	if verr != nil {
		return e, verr
	}
	if string(typ) != EventType {
		return e, &ValidationError{"event_type", fmt.Sprintf("%.40q is not %q", string(typ), EventType)}
	}
	e.EventType = EventType
	if e.OccurredAt, verr = occurredAt(&rec, horizon); verr != nil {
		return e, verr
	}
	if e.OrderID, verr = positiveInt(&rec, fieldOrderID); verr != nil {
		return e, verr
	}
	if e.CustomerID, verr = positiveInt(&rec, fieldCustomerID); verr != nil {
		return e, verr
	}
	if e.TotalAmount, verr = amount(&rec, fieldTotalAmount); verr != nil {
		return e, verr
	}
	return e, nil
}

// canonicalUUIDLen is the length of the hyphenated 8-4-4-4-12 form.
// uuid.Parse also takes the braced, urn:uuid: and unhyphenated forms; only
// the form every producer library emits is accepted, so that a malformed id
// is caught here rather than guessed at. Hex digits may be upper or lower
// case (RFC 9562 asks parsers to accept both): both parse to the same
// 16 bytes, the dedup key, and EventID.String() is lowercase either way.
const canonicalUUIDLen = 36

func eventID(rec *record, horizon time.Time) (uuid.UUID, *ValidationError) {
	const field = "event_id"
	s, verr := str(rec, fieldEventID)
	if verr != nil {
		return uuid.Nil, verr
	}
	if len(s) != canonicalUUIDLen {
		return uuid.Nil, &ValidationError{field, "not a UUID in the 8-4-4-4-12 hyphenated form"}
	}
	id, err := uuid.ParseBytes(s)
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

// uuidTime returns the Unix-millisecond timestamp in a UUIDv7's first 48
// bits. Unlike uuid.UUID.Time it involves no Gregorian-epoch arithmetic that
// could overflow for timestamps near 2^48 ms.
func uuidTime(id uuid.UUID) time.Time {
	ms := binary.BigEndian.Uint64(id[:8]) >> 16
	return time.UnixMilli(int64(ms))
}

func occurredAt(rec *record, horizon time.Time) (time.Time, *ValidationError) {
	const field = "occurred_at"
	b, verr := str(rec, fieldOccurredAt)
	if verr != nil {
		return time.Time{}, verr
	}
	s := string(b)
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !rfc3339Shape(s) {
		return time.Time{}, &ValidationError{field, "not an RFC 3339 timestamp with offset"}
	}
	if t.UTC().Year() < 0 {
		// "0000-01-01T00:00:00+01:00" is year -1 in UTC, which RFC 3339
		// cannot write: the event could not be re-encoded canonically.
		return time.Time{}, &ValidationError{field, "before year 0000 in UTC"}
	}
	if t.After(horizon) {
		return time.Time{}, &ValidationError{field, "more than 24h ahead of the consumer's clock"}
	}
	return t.UTC(), nil
}

// rfc3339Shape reports whether s has the fixed-width shape of RFC 3339:
// "2006-01-02T15:04:05", an optional "." and fraction digits, then "Z" or
// "+hh:mm"/"-hh:mm" with hh <= 23 and mm <= 59. time.Parse checks the field
// ranges but, when its fast path fails, also takes a one-digit hour, a
// comma before the fraction and offsets such as +24:00 or +23:60. Like
// time.Parse it rejects the lowercase "t" and "z" that RFC 3339 tolerates.
func rfc3339Shape(s string) bool {
	const shape = "0000-00-00T00:00:00" // '0' stands for any digit
	if len(s) < len(shape) {
		return false
	}
	for i := 0; i < len(shape); i++ {
		if shape[i] == '0' && !isDigit(s[i]) || shape[i] != '0' && s[i] != shape[i] {
			return false
		}
	}
	rest := s[len(shape):]
	if len(rest) > 0 && rest[0] == '.' {
		n := 1
		for n < len(rest) && isDigit(rest[n]) {
			n++
		}
		if n == 1 {
			return false
		}
		rest = rest[n:]
	}
	if rest == "Z" {
		return true
	}
	return len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':' &&
		isDigit(rest[1]) && isDigit(rest[2]) && isDigit(rest[4]) && isDigit(rest[5]) &&
		rest[1:3] <= "23" && rest[4:6] <= "59"
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// positiveInt reads a JSON integer in 1..math.MaxInt64. The number's text is
// parsed as an integer, so 1.0, 1e3 and 9223372036854775808 are rejected
// instead of being rounded through float64.
func positiveInt(rec *record, i int) (int64, *ValidationError) {
	m, verr := present(rec, i)
	if verr != nil {
		return 0, verr
	}
	field := fieldNames[i]
	if m.kind != kindNumber {
		return 0, &ValidationError{field, "must be a JSON integer, not " + m.kind.String()}
	}
	v, err := strconv.ParseInt(string(m.text), 10, 64)
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
func amount(rec *record, i int) (money.Amount, *ValidationError) {
	m, verr := present(rec, i)
	if verr != nil {
		return 0, verr
	}
	field := fieldNames[i]
	if m.kind != kindString && m.kind != kindNumber {
		return 0, &ValidationError{field, "must be a JSON string or number, not " + m.kind.String()}
	}
	a, err := money.ParseAmount(string(m.text))
	if err != nil {
		return 0, &ValidationError{field, amountReason(err)}
	}
	return a, nil
}

// amountReason drops the `amount "<text>": ` prefix of a money.ParseAmount
// error, keeping the rule that failed: the amount is not repeated in logs or
// DLQ headers (the record itself is in the DLQ).
func amountReason(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// str reads a member that must be a JSON string and returns its decoded
// contents.
func str(rec *record, i int) ([]byte, *ValidationError) {
	m, verr := present(rec, i)
	if verr != nil {
		return nil, verr
	}
	if m.kind != kindString {
		return nil, &ValidationError{fieldNames[i], "must be a JSON string, not " + m.kind.String()}
	}
	return m.text, nil
}

// present returns a present, non-null member: null counts as missing.
func present(rec *record, i int) (member, *ValidationError) {
	if m := rec[i]; m.kind != kindAbsent && m.kind != kindNull {
		return m, nil
	}
	return member{}, &ValidationError{fieldNames[i], "missing"}
}

// String names the JSON type for error messages ("a string", "an array").
func (k kind) String() string {
	switch k {
	case kindString:
		return "a string"
	case kindNumber:
		return "a number"
	case kindBool:
		return "a boolean"
	case kindArray:
		return "an array"
	case kindObject:
		return "an object"
	}
	return "null"
}
