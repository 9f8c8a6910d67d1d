// Package events decodes and validates the order.confirmed Kafka record
// value into an OrderConfirmed (SPEC §4).
//
// Decoding is strict because the record moves money: an ambiguous record
// (duplicate keys, an amount that would need rounding, an id that does not
// fit in int64) is rejected as invalid rather than guessed at, and goes to
// the DLQ with reason "invalid". Nothing here does I/O or reads the clock;
// the caller passes "now".
package events

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/money"
)

// EventType is the only event_type Decode accepts.
const EventType = "order.confirmed.v1"

// MaxFutureSkew is how far ahead of the consumer's clock an occurred_at or
// an event_id's UUIDv7 time may be. Anything further ahead comes from a
// broken or forged producer clock and is invalid; old events are valid.
const MaxFutureSkew = 24 * time.Hour

// MaxValueBytes is the largest record value Decode accepts. Larger values
// are invalid without being parsed, which bounds the work one record costs.
const MaxValueBytes = 64 << 10

// OrderConfirmed is a validated order.confirmed.v1 event. A value returned
// by Decode without error satisfies every rule of SPEC §4; a value built by
// hand has not been validated.
type OrderConfirmed struct {
	// EventID is the UUIDv7 event_id: the only deduplication key and the
	// payment Idempotency-Key. Its String form is canonical lowercase,
	// whatever the case of the record.
	EventID uuid.UUID
	// EventType is always EventType.
	EventType string
	// OccurredAt is when the order was confirmed, in UTC (the record's
	// offset is not kept). It is at most MaxFutureSkew ahead of the "now"
	// passed to Decode, and may be arbitrarily old.
	OccurredAt time.Time
	// OrderID is the order to charge, in 1..math.MaxInt64.
	OrderID int64
	// CustomerID is the customer to charge, in 1..math.MaxInt64.
	CustomerID int64
	// TotalAmount is the amount to charge, in (0, money.Max]. Its String
	// form is the canonical text sent onward.
	TotalAmount money.Amount
}

// ValidationError says which rule a record broke. Field is the JSON field
// name (e.g. "total_amount"), or "" when the record as a whole is wrong
// (not UTF-8, not a JSON object, too large, duplicate keys, too deep).
// Reason is short and never contains the record's amount or ids, so it is
// safe for logs and the dlq-error header.
//
// Decode wraps it with fault.New(fault.Invalid, ...); reach it with
// errors.As.
type ValidationError struct {
	Field  string
	Reason string
}

// Error returns `invalid event: field "total_amount": <reason>`, or
// `invalid event: <reason>` for record-level errors.
func (e *ValidationError) Error() string {
	if e.Field == "" {
		return "invalid event: " + e.Reason
	}
	return fmt.Sprintf("invalid event: field %q: %s", e.Field, e.Reason)
}
