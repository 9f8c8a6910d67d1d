package payment_test

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// engines and forEachClient are client_test.go's, for this package.
var engines = []payment.Engine{payment.NetHTTP, payment.FastHTTP}

func forEachClient(t *testing.T, test func(t *testing.T)) {
	t.Helper()
	for _, e := range engines {
		t.Run(string(e), test)
	}
}

// engineOf returns the engine of the forEachClient subtest t runs in.
func engineOf(t *testing.T) payment.Engine {
	t.Helper()
	for _, part := range strings.Split(t.Name(), "/") {
		for _, e := range engines {
			if part == string(e) {
				return e
			}
		}
	}
	t.Fatalf("%s: a client outside forEachClient", t.Name())
	return ""
}

// simClient starts sim behind an httptest.Server and returns a client of
// the engine under test for it.
func simClient(t *testing.T, sim *paysim.Sim, token string) *payment.Client {
	t.Helper()
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	c, err := payment.New(payment.Config{Engine: engineOf(t), BaseURL: srv.URL + "/", Token: token, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func kindOf(t *testing.T, err error) fault.Kind {
	t.Helper()
	var e *payment.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v carries no *payment.Error", err)
	}
	return fault.KindOf(err)
}

// simCharge returns the charge of the SPEC example event.
func simCharge() payment.Charge {
	return payment.Charge{IdempotencyKey: "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1d", OrderID: 1001, CustomerID: 42, Amount: 9990}
}

// TestResetThenRetryChargesOnce is the accept-then-reset scenario: the
// provider takes the charge but the answer is lost; the caller's retry with
// the same Charge gets the stored answer, and the order is charged once.
func TestResetThenRetryChargesOnce(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		sim := paysim.New(paysim.Config{Token: "tok", Faults: paysim.Faults{ResetRate: 1}})
		c := simClient(t, sim, "tok")

		_, err := c.Charge(t.Context(), simCharge())
		if err == nil || kindOf(t, err) != fault.Transient {
			t.Fatalf("first attempt: %v, want a Transient error", err)
		}
		res, err := c.Charge(t.Context(), simCharge())
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		recs := sim.Charges()
		if len(recs) != 1 || res.ChargeID != recs[0].ChargeID || !res.Replayed || res.Status != 200 {
			t.Errorf("retry = %+v, charges %+v; want the one stored charge, replayed", res, recs)
		}
		if n := sim.ChargesFor(simCharge().OrderID); n != 1 {
			t.Errorf("ChargesFor = %d, want 1", n)
		}
		if recs[0].Amount != "99.90" || recs[0].Key != simCharge().IdempotencyKey {
			t.Errorf("charge record %+v", recs[0])
		}
	})
}

func TestAgainstSimulator(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		t.Run("5xx then success", func(t *testing.T) {
			sim := paysim.New(paysim.Config{Faults: paysim.Faults{ErrorRate: 1}})
			c := simClient(t, sim, "")
			if _, err := c.Charge(t.Context(), simCharge()); kindOf(t, err) != fault.Transient {
				t.Errorf("500: %v, want Transient", err)
			}
			sim.SetFaults(paysim.Faults{})
			res, err := c.Charge(t.Context(), simCharge())
			if err != nil || res.Replayed || res.ChargeID == "" {
				t.Errorf("retry = %+v, %v; want a fresh charge", res, err)
			}
			if n := sim.ChargesFor(simCharge().OrderID); n != 1 {
				t.Errorf("ChargesFor = %d, want 1", n)
			}
		})
		t.Run("same key other amount is Conflict", func(t *testing.T) {
			sim := paysim.New(paysim.Config{})
			c := simClient(t, sim, "")
			if _, err := c.Charge(t.Context(), simCharge()); err != nil {
				t.Fatal(err)
			}
			other := simCharge()
			other.Amount++
			_, err := c.Charge(t.Context(), other)
			if kindOf(t, err) != fault.Conflict {
				t.Errorf("%v, want Conflict", err)
			}
			var e *payment.Error
			if !errors.As(err, &e) || e.Status != 422 || e.Code != "idempotency_key_reused" {
				t.Errorf("%v, want 422 idempotency_key_reused", err)
			}
		})
		t.Run("decline is Permanent", func(t *testing.T) {
			sim := paysim.New(paysim.Config{Faults: paysim.Faults{Decline: func(int64) bool { return true }}})
			c := simClient(t, sim, "")
			for range 2 { // the stored 402 is replayed
				if _, err := c.Charge(t.Context(), simCharge()); kindOf(t, err) != fault.Permanent {
					t.Errorf("%v, want Permanent", err)
				}
			}
			if sim.ChargesTaken() != 0 {
				t.Error("a declined charge was taken")
			}
		})
		t.Run("in flight is Transient", func(t *testing.T) {
			sim := paysim.New(paysim.Config{Faults: paysim.Faults{Latency: 200 * time.Millisecond}})
			c := simClient(t, sim, "")
			done := make(chan error, 1)
			go func() { _, err := c.Charge(t.Context(), simCharge()); done <- err }()
			poll.Until(t, 10*time.Second, "one charge in flight", func() bool { return sim.InFlight() == 1 })
			_, err := c.Charge(t.Context(), simCharge())
			var e *payment.Error
			if kindOf(t, err) != fault.Transient || !errors.As(err, &e) || e.Status != 409 {
				t.Errorf("%v, want Transient 409", err)
			}
			if err := <-done; err != nil {
				t.Errorf("first attempt: %v", err)
			}
		})
		t.Run("wrong token is Systemic", func(t *testing.T) {
			sim := paysim.New(paysim.Config{Token: "right"})
			c := simClient(t, sim, "wrong")
			_, err := c.Charge(t.Context(), simCharge())
			if kindOf(t, err) != fault.Systemic {
				t.Errorf("%v, want Systemic", err)
			}
		})
		t.Run("timeout, then the stored answer", func(t *testing.T) {
			sim := paysim.New(paysim.Config{Faults: paysim.Faults{Latency: 300 * time.Millisecond}})
			srv := httptest.NewServer(sim)
			t.Cleanup(srv.Close)
			c, err := payment.New(payment.Config{Engine: engineOf(t), BaseURL: srv.URL, Timeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Charge(t.Context(), simCharge()); kindOf(t, err) != fault.Transient {
				t.Fatalf("%v, want Transient", err)
			}
			// The provider finishes the charge after we gave up; poll, then retry.
			poll.Until(t, 10*time.Second, "the charge to be taken", func() bool { return sim.ChargesTaken() == 1 && sim.InFlight() == 0 })
			sim.SetFaults(paysim.Faults{})
			res, err := c.Charge(t.Context(), simCharge())
			if err != nil || !res.Replayed {
				t.Errorf("retry = %+v, %v; want the stored answer", res, err)
			}
			if n := sim.ChargesFor(simCharge().OrderID); n != 1 {
				t.Errorf("ChargesFor = %d, want 1", n)
			}
		})
	})
}
