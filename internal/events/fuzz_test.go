package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// FuzzDecode checks that Decode never panics, that every error is an
// invalid *ValidationError, and that every success satisfies the event's
// invariants and survives a round trip through its canonical encoding.
// Every fixture is a seed, so plain `go test` runs them all.
func FuzzDecode(f *testing.F) {
	addFixtureSeeds(f)
	f.Fuzz(func(t *testing.T, value []byte) {
		e, err := Decode(value, testNow)
		if err != nil {
			checkDecodeError(t, value, e, err)
			return
		}
		checkInvariants(t, value, e)
		for _, asNumber := range []bool{false, true} {
			again, err := Decode(encodeCanonical(e, asNumber), testNow)
			if err != nil {
				t.Fatalf("canonical re-encoding (amount as number: %v) of %+v: %v", asNumber, e, err)
			}
			if again != e {
				t.Fatalf("round trip changed the event:\n %+v\n %+v", e, again)
			}
		}
	})
}

// addFixtureSeeds adds every testdata fixture to f's seed corpus.
func addFixtureSeeds(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

var knownFields = map[string]bool{
	"": true, "event_id": true, "event_type": true, "occurred_at": true,
	"order_id": true, "customer_id": true, "total_amount": true,
}

func checkDecodeError(t *testing.T, value []byte, e OrderConfirmed, err error) {
	t.Helper()
	if e != (OrderConfirmed{}) {
		t.Errorf("Decode returned %+v with error %v", e, err)
	}
	if k := fault.KindOf(err); k != fault.Invalid {
		t.Errorf("fault.KindOf(%v) = %v, want invalid", err, k)
	}
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("error %v does not wrap *ValidationError", err)
	}
	if !knownFields[verr.Field] || verr.Reason == "" {
		t.Errorf("ValidationError{%q, %q}: unknown field or empty reason", verr.Field, verr.Reason)
	}
	if !strings.HasPrefix(err.Error(), "invalid event: ") {
		t.Errorf("error %q lacks the \"invalid event: \" prefix", err)
	}
}

func checkInvariants(t *testing.T, value []byte, e OrderConfirmed) {
	t.Helper()
	horizon := testNow.Add(MaxFutureSkew)
	if len(value) > MaxValueBytes {
		t.Errorf("accepted a %d-byte value", len(value))
	}
	// The scanner must not be more lenient than the standard parser.
	if !json.Valid(value) {
		t.Errorf("accepted a value encoding/json calls invalid: %q", value)
	}
	if e.EventID.Version() != 7 {
		t.Errorf("EventID %s has version %d", e.EventID, e.EventID.Version())
	}
	if e.EventID.Variant() != uuid.RFC4122 {
		t.Errorf("EventID %s has variant %v", e.EventID, e.EventID.Variant())
	}
	if uuidTime(e.EventID).After(horizon) {
		t.Errorf("EventID %s time %v is after %v", e.EventID, uuidTime(e.EventID), horizon)
	}
	if e.EventType != EventType {
		t.Errorf("EventType = %q", e.EventType)
	}
	if e.OccurredAt.After(horizon) || e.OccurredAt.Location() != time.UTC {
		t.Errorf("OccurredAt = %v, want UTC and not after %v", e.OccurredAt, horizon)
	}
	if e.OrderID < 1 || e.CustomerID < 1 {
		t.Errorf("OrderID %d, CustomerID %d: want positive", e.OrderID, e.CustomerID)
	}
	if e.TotalAmount <= 0 || e.TotalAmount > money.Max {
		t.Errorf("TotalAmount %d outside (0, %d]", e.TotalAmount, money.Max)
	}
}

// encodeCanonical writes e the way a well-behaved producer would. All the
// strings are ASCII, where Go's %q quoting is JSON's.
func encodeCanonical(e OrderConfirmed, amountAsNumber bool) []byte {
	amount := fmt.Sprintf("%q", e.TotalAmount.String())
	if amountAsNumber {
		amount = e.TotalAmount.String()
	}
	return fmt.Appendf(nil,
		`{"event_id":%q,"event_type":%q,"occurred_at":%q,"order_id":%d,"customer_id":%d,"total_amount":%s}`,
		e.EventID.String(), e.EventType, e.OccurredAt.Format(time.RFC3339Nano),
		e.OrderID, e.CustomerID, amount)
}
