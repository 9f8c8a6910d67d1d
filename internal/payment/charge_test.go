package payment

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/money"
)

func TestChargeBody(t *testing.T) {
	tests := []struct {
		ch   Charge
		want string
	}{
		{Charge{IdempotencyKey: "k", OrderID: 1001, CustomerID: 42, Amount: 9990}, `{"order_id":1001,"customer_id":42,"amount":"99.90"}`},
		{Charge{OrderID: 1, CustomerID: 1, Amount: 1}, `{"order_id":1,"customer_id":1,"amount":"0.01"}`},
		{Charge{OrderID: 9223372036854775807, CustomerID: 7, Amount: money.Max}, `{"order_id":9223372036854775807,"customer_id":7,"amount":"100000000.00"}`},
		{Charge{OrderID: 5, CustomerID: 6, Amount: 500}, `{"order_id":5,"customer_id":6,"amount":"5.00"}`},
	}
	for _, tt := range tests {
		got := tt.ch.Body()
		if string(got) != tt.want {
			t.Errorf("Body() = %s, want %s", got, tt.want)
		}
		if again := tt.ch.Body(); !bytes.Equal(got, again) {
			t.Errorf("Body() not stable: %s then %s", got, again)
		}
	}
	// The key is not part of the body: it travels in the header.
	a := Charge{IdempotencyKey: "a", OrderID: 1, CustomerID: 2, Amount: 3}
	b := a
	b.IdempotencyKey = "b"
	if !bytes.Equal(a.Body(), b.Body()) {
		t.Error("body depends on the idempotency key")
	}
}

// FuzzChargeBody checks that every body is valid JSON carrying exactly the
// charge's values, in the field order encoding/json would also produce.
func FuzzChargeBody(f *testing.F) {
	f.Add(int64(1001), int64(42), int64(9990))
	f.Add(int64(1), int64(1), int64(1))
	f.Add(int64(-5), int64(0), int64(-150))
	f.Fuzz(func(t *testing.T, order, customer, cents int64) {
		if cents <= -(1<<62) || cents >= 1<<62 {
			t.Skip() // Amount.String negates; keep clear of MinInt64
		}
		ch := Charge{OrderID: order, CustomerID: customer, Amount: money.Amount(cents)}
		body := ch.Body()
		var got struct {
			OrderID    int64  `json:"order_id"`
			CustomerID int64  `json:"customer_id"`
			Amount     string `json:"amount"`
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("body %s is not JSON: %v", body, err)
		}
		if got.OrderID != order || got.CustomerID != customer || got.Amount != ch.Amount.String() {
			t.Fatalf("body %s decodes to %+v", body, got)
		}
		want, _ := json.Marshal(got)
		if !bytes.Equal(body, want) {
			t.Fatalf("body %s, encoding/json gives %s", body, want)
		}
	})
}

func TestChargeValidate(t *testing.T) {
	ok := Charge{IdempotencyKey: "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1d", OrderID: 1, CustomerID: 1, Amount: 1}
	if err := ok.validate(); err != nil {
		t.Fatalf("valid charge: %v", err)
	}
	long := make([]byte, maxKeyLen+1)
	for i := range long {
		long[i] = 'k'
	}
	for name, mutate := range map[string]func(*Charge){
		"empty key":      func(c *Charge) { c.IdempotencyKey = "" },
		"long key":       func(c *Charge) { c.IdempotencyKey = string(long) },
		"key with space": func(c *Charge) { c.IdempotencyKey = "a b" },
		"key with CRLF":  func(c *Charge) { c.IdempotencyKey = "a\r\nX-Evil: 1" },
		"zero order":     func(c *Charge) { c.OrderID = 0 },
		"negative cust":  func(c *Charge) { c.CustomerID = -1 },
		"zero amount":    func(c *Charge) { c.Amount = 0 },
		"huge amount":    func(c *Charge) { c.Amount = money.Max + 1 },
	} {
		ch := ok
		mutate(&ch)
		if ch.validate() == nil {
			t.Errorf("%s: validate() = nil", name)
		}
	}
}
