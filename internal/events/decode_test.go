package events

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// testNow is the consumer's clock in every test: fixtures with times are
// written relative to it, so nothing depends on when the tests run.
var testNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// baseEvent is what testdata/valid/basic.json decodes to; the other valid
// fixtures differ from it in the fields their table entry changes.
func baseEvent() OrderConfirmed {
	return OrderConfirmed{
		EventID:     uuid.MustParse("01a2272d-2600-7b1a-9c3d-2e4f6a8b0c1d"),
		EventType:   EventType,
		OccurredAt:  time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		OrderID:     1001,
		CustomerID:  42,
		TotalAmount: 9990,
	}
}

// validFixtures maps each testdata/valid file (without .json) to the change
// it makes to baseEvent.
var validFixtures = map[string]func(e *OrderConfirmed){
	"basic":                     func(e *OrderConfirmed) {},
	"pretty":                    func(e *OrderConfirmed) {},
	"field_order":               func(e *OrderConfirmed) {}, // total_amount 99.90 as a number
	"unknown_fields":            func(e *OrderConfirmed) {}, // TOTAL_AMOUNT and Order_ID are other keys
	"escaped_key":               func(e *OrderConfirmed) {},
	"spec_example":              func(e *OrderConfirmed) { e.EventID = uuid.MustParse("0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1d") },
	"amount_number_one_decimal": func(e *OrderConfirmed) { e.TotalAmount = 9990 },
	"amount_number_integer":     func(e *OrderConfirmed) { e.TotalAmount = 10000 },
	"amount_string_integer":     func(e *OrderConfirmed) { e.TotalAmount = 10000 },
	"amount_min":                func(e *OrderConfirmed) { e.TotalAmount = 1 },
	"amount_max":                func(e *OrderConfirmed) { e.TotalAmount = money.Max },
	"ids_max": func(e *OrderConfirmed) {
		e.OrderID, e.CustomerID = 9223372036854775807, 9223372036854775807
	},
	"ids_min":                     func(e *OrderConfirmed) { e.OrderID, e.CustomerID = 1, 1 },
	"occurred_at_offset":          func(e *OrderConfirmed) {}, // 14:00+02:00 is the same instant, kept in UTC
	"occurred_at_negative_offset": func(e *OrderConfirmed) {}, // 06:30-05:30 is 12:00Z
	"occurred_at_fraction": func(e *OrderConfirmed) {
		e.OccurredAt = e.OccurredAt.Add(123456789 * time.Nanosecond)
	},
	"occurred_at_old":               func(e *OrderConfirmed) { e.OccurredAt = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC) },
	"occurred_at_23h_ahead":         func(e *OrderConfirmed) { e.OccurredAt = testNow.Add(23 * time.Hour) },
	"occurred_at_23h_ahead_offset":  func(e *OrderConfirmed) { e.OccurredAt = testNow.Add(23 * time.Hour) },
	"occurred_at_24h_ahead_exactly": func(e *OrderConfirmed) { e.OccurredAt = testNow.Add(24 * time.Hour) },
	"event_id_uppercase":            func(e *OrderConfirmed) {},
	"event_id_23h_ahead": func(e *OrderConfirmed) {
		e.EventID = uuid.MustParse("01a23142-ef80-7b1a-9c3d-2e4f6a8b0c1d")
	},
	"event_id_24h_ahead_exactly": func(e *OrderConfirmed) {
		e.EventID = uuid.MustParse("01a23179-de00-7b1a-9c3d-2e4f6a8b0c1d")
	},
	"event_id_old": func(e *OrderConfirmed) { e.EventID = uuid.MustParse("00000000-0000-7000-8000-000000000000") },
}

func TestDecodeValid(t *testing.T) {
	for _, name := range fixtureNames(t, "valid", len(validFixtures)) {
		t.Run(name, func(t *testing.T) {
			change, ok := validFixtures[name]
			if !ok {
				t.Fatalf("testdata/valid/%s.json has no entry in validFixtures", name)
			}
			want := baseEvent()
			change(&want)
			got, err := Decode(readFixture(t, "valid", name), testNow)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got != want {
				t.Errorf("Decode =\n %+v\nwant\n %+v", got, want)
			}
		})
	}
}

func TestDecodeValidTimesAreUTC(t *testing.T) {
	got, err := Decode(readFixture(t, "valid", "occurred_at_offset"), testNow)
	if err != nil {
		t.Fatal(err)
	}
	if got.OccurredAt.Location() != time.UTC {
		t.Errorf("OccurredAt location = %v, want UTC", got.OccurredAt.Location())
	}
	if s := got.EventID.String(); s != strings.ToLower(s) {
		t.Errorf("EventID.String() = %q, want lowercase", s)
	}
}

func TestDecodeValidAmountCanonical(t *testing.T) {
	for _, name := range []string{"basic", "amount_number_one_decimal", "field_order"} {
		got, err := Decode(readFixture(t, "valid", name), testNow)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s := got.TotalAmount.String(); s != "99.90" {
			t.Errorf("%s: TotalAmount.String() = %q, want \"99.90\"", name, s)
		}
	}
}

func TestDecodeInvalid(t *testing.T) {
	for _, name := range fixtureNames(t, "invalid", len(invalidFixtures)) {
		t.Run(name, func(t *testing.T) {
			want, ok := invalidFixtures[name]
			if !ok {
				t.Fatalf("testdata/invalid/%s.json has no entry in invalidFixtures", name)
			}
			checkInvalid(t, readFixture(t, "invalid", name), want)
		})
	}
}

// TestDecodeGenerated covers inputs too large or too binary for fixtures.
func TestDecodeGenerated(t *testing.T) {
	valid := bytes.TrimSpace(readFixture(t, "valid", "basic"))
	// pad returns valid with an unknown string field making it n bytes long.
	pad := func(n int) []byte {
		prefix := append(valid[:len(valid)-1:len(valid)-1], `,"pad":"`...)
		fill := n - len(prefix) - len(`"}`)
		return append(append(prefix, bytes.Repeat([]byte("x"), fill)...), `"}`...)
	}
	// nest returns valid with an unknown field holding arrays nested so
	// that the deepest value is at the given depth (the record is depth 1).
	nest := func(depth int) []byte {
		inner := strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1)
		return append(valid[:len(valid)-1:len(valid)-1], `,"deep":`+inner+`}`...)
	}

	t.Run("max_size_valid", func(t *testing.T) {
		v := pad(MaxValueBytes)
		if len(v) != MaxValueBytes {
			t.Fatalf("len = %d", len(v))
		}
		if _, err := Decode(v, testNow); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("oversized", func(t *testing.T) {
		checkInvalid(t, pad(MaxValueBytes+1), invalidCase{"", "larger than"})
	})
	t.Run("oversized_garbage", func(t *testing.T) {
		// Size is checked before anything else, even UTF-8 validity.
		checkInvalid(t, bytes.Repeat([]byte{0xff}, 1<<20), invalidCase{"", "larger than"})
	})
	t.Run("depth_32_valid", func(t *testing.T) {
		if _, err := Decode(nest(32), testNow); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("depth_33", func(t *testing.T) {
		checkInvalid(t, nest(33), invalidCase{"", "nested deeper"})
	})
	t.Run("depth_30000", func(t *testing.T) {
		checkInvalid(t, nest(30000), invalidCase{"", "nested deeper"})
	})
	t.Run("deep_objects", func(t *testing.T) {
		v := `{"a":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat("}", 41)
		checkInvalid(t, []byte(v), invalidCase{"", "nested deeper"})
	})
	t.Run("nil", func(t *testing.T) {
		checkInvalid(t, nil, invalidCase{"", "empty"})
	})
	t.Run("nul_byte", func(t *testing.T) {
		checkInvalid(t, append(valid[:len(valid):len(valid)], 0), invalidCase{"", "data after the JSON object"})
	})
}

func TestValidationErrorFormat(t *testing.T) {
	_, err := Decode(readFixture(t, "invalid", "amount_three_decimals"), testNow)
	want := `invalid event: field "total_amount": more than 2 fractional digits`
	if err == nil || err.Error() != want {
		t.Errorf("Decode error = %v, want %s", err, want)
	}
	_, err = Decode(readFixture(t, "invalid", "duplicate_total_amount"), testNow)
	want = `invalid event: duplicate key "total_amount"`
	if err == nil || err.Error() != want {
		t.Errorf("Decode error = %v, want %s", err, want)
	}
}

// invalidCase is what Decode must report for an invalid record: the field
// ("" for the record as a whole) and a substring of the reason, so that a
// fixture cannot pass by failing some other rule.
type invalidCase struct {
	field  string
	reason string
}

func checkInvalid(t *testing.T, value []byte, want invalidCase) {
	t.Helper()
	got, err := Decode(value, testNow)
	if err == nil {
		t.Fatalf("Decode succeeded with %+v, want an error", got)
	}
	if got != (OrderConfirmed{}) {
		t.Errorf("Decode returned %+v with its error, want the zero value", got)
	}
	if k := fault.KindOf(err); k != fault.Invalid {
		t.Errorf("fault.KindOf(%v) = %v, want invalid", err, k)
	}
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("error %v (%T) does not wrap *ValidationError", err, err)
	}
	if verr.Field != want.field || !strings.Contains(verr.Reason, want.reason) {
		t.Errorf("ValidationError{%q, %q}, want field %q with reason containing %q",
			verr.Field, verr.Reason, want.field, want.reason)
	}
}

// fixtureNames lists testdata/<dir>/*.json without the extension and
// checks that the table describing them has exactly as many entries, so a
// fixture cannot be added or removed without saying what it expects.
func fixtureNames(t *testing.T, dir string, tableLen int) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, strings.TrimSuffix(filepath.Base(p), ".json"))
	}
	if len(names) != tableLen {
		t.Errorf("testdata/%s has %d fixtures, its table %d entries", dir, len(names), tableLen)
	}
	return names
}

func readFixture(t testing.TB, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", dir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUUIDTime pins the hand-written UUIDv7 boundary fixtures to testNow.
func TestUUIDTime(t *testing.T) {
	for name, want := range map[string]time.Time{
		"basic":                      time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		"event_id_23h_ahead":         testNow.Add(23 * time.Hour),
		"event_id_24h_ahead_exactly": testNow.Add(MaxFutureSkew),
		"event_id_old":               time.UnixMilli(0),
	} {
		e, err := Decode(readFixture(t, "valid", name), testNow)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := uuidTime(e.EventID); !got.Equal(want) {
			t.Errorf("%s: uuidTime = %v, want %v", name, got, want)
		}
	}
	id := uuid.MustParse("01a23179-de00-7b1a-9c3d-2e4f6a8b0c1d")
	sec, nsec := id.Time().UnixTime()
	if got := uuidTime(id); !got.Equal(time.Unix(sec, nsec)) {
		t.Errorf("uuidTime(%s) = %v disagrees with uuid.UUID.Time", id, got)
	}
}
