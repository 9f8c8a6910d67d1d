package payment_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// A 409 (the provider believes the key is in flight) is transient: the
// retry with the same Charge is processed and charges once.
func TestConflict409ThenRetryChargesOnce(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		sim := paysim.New(paysim.Config{Token: "tok", Faults: paysim.Faults{ConflictRate: 1}})
		c := simClient(t, sim, "tok")
		if _, err := c.Charge(t.Context(), simCharge()); kindOf(t, err) != fault.Transient {
			t.Fatalf("409: %v; want transient", err)
		}
		if sim.ChargesTaken() != 0 || sim.Injected().Conflicts != 1 {
			t.Fatalf("after a 409: %d charges, injected %+v", sim.ChargesTaken(), sim.Injected())
		}
		sim.SetFaults(paysim.Faults{})
		if _, err := c.Charge(t.Context(), simCharge()); err != nil {
			t.Fatal(err)
		}
		if sim.ChargesFor(1001) != 1 {
			t.Fatalf("charges %d, want 1", sim.ChargesFor(1001))
		}
	})
}

// A slow body that outlasts the client's timeout loses an answer whose
// charge was taken: transient, and the retry gets the stored answer.
func TestSlowBodyThenRetryChargesOnce(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		sim := paysim.New(paysim.Config{Token: "tok", Faults: paysim.Faults{SlowBodyRate: 1, SlowBodyDelay: 2 * time.Second}})
		srv := httptest.NewServer(sim)
		t.Cleanup(srv.Close)
		c, err := payment.New(payment.Config{Engine: engineOf(t), BaseURL: srv.URL, Token: "tok", Timeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Charge(t.Context(), simCharge()); kindOf(t, err) != fault.Transient {
			t.Fatalf("slow body: %v; want transient (outcome unknown)", err)
		}
		if sim.ChargesFor(1001) != 1 || sim.Injected().SlowBodies != 1 {
			t.Fatalf("after the slow body: %d charges, injected %+v", sim.ChargesFor(1001), sim.Injected())
		}
		sim.SetFaults(paysim.Faults{})
		r, err := c.Charge(t.Context(), simCharge())
		if err != nil || !r.Replayed || r.ChargeID == "" {
			t.Fatalf("retry: %+v, %v; want the replayed answer", r, err)
		}
		if sim.ChargesFor(1001) != 1 {
			t.Fatalf("charges %d, want 1", sim.ChargesFor(1001))
		}
	})
}
