package payment

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/billing-consumer/billing-consumer/internal/money"
)

// maxKeyLen is the longest Idempotency-Key accepted, the limit Stripe-like
// providers enforce. An event_id (36 characters) is far below it.
const maxKeyLen = 255

// Charge is one charge request. Every attempt for the same event must use
// the same Charge: the provider recognises a repeated attempt by its
// IdempotencyKey and answers 422 when the body under that key differs.
type Charge struct {
	// IdempotencyKey is the event_id: at most 255 visible ASCII characters.
	IdempotencyKey string
	// OrderID and CustomerID are positive.
	OrderID    int64
	CustomerID int64
	// Amount is positive and at most money.Max.
	Amount money.Amount
}

// Body returns the canonical request body,
// {"order_id":1001,"customer_id":42,"amount":"99.90"}: fixed field order, no
// spaces, the amount in its canonical text form. Equal Charges give
// byte-identical bodies, which is what lets a retry reuse the idempotency
// key. It is built by hand rather than with encoding/json so that no
// encoder change can ever alter the bytes.
func (ch Charge) Body() []byte { return ch.appendBody(make([]byte, 0, maxBodyLen)) }

// appendBody appends Body's bytes to b.
func (ch Charge) appendBody(b []byte) []byte {
	b = append(b, `{"order_id":`...)
	b = strconv.AppendInt(b, ch.OrderID, 10)
	b = append(b, `,"customer_id":`...)
	b = strconv.AppendInt(b, ch.CustomerID, 10)
	b = append(b, `,"amount":"`...)
	b = append(b, ch.Amount.String()...) // digits and a point: nothing to escape
	b = append(b, `"}`...)
	return b
}

// validate rejects a Charge that the provider could only refuse; these are
// bugs upstream (the event was validated), never worth a network call.
func (ch Charge) validate() error {
	switch {
	case ch.IdempotencyKey == "":
		return errors.New("empty idempotency key")
	case len(ch.IdempotencyKey) > maxKeyLen:
		return fmt.Errorf("idempotency key longer than %d bytes", maxKeyLen)
	case !visibleASCII(ch.IdempotencyKey):
		return errors.New("idempotency key has characters outside visible ASCII")
	case ch.OrderID <= 0:
		return fmt.Errorf("order id %d is not positive", ch.OrderID)
	case ch.CustomerID <= 0:
		return fmt.Errorf("customer id %d is not positive", ch.CustomerID)
	case ch.Amount <= 0 || ch.Amount > money.Max:
		return errors.New("amount out of range")
	}
	return nil
}

// visibleASCII reports whether s is made only of printable, non-space ASCII
// (0x21-0x7E): safe in a header value and in a log line.
func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
