package billing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/paysim"
)

// A parked claim is the completer's from then on: its passes over parked
// claims re-send it long before BILLING_COMPLETER_AFTER, on a backoff from
// a second (the database's clock), and settle it once the provider
// answers; the counts say how many are parked meanwhile. Park answers
// false for an event without a pending claim.
func TestParkedClaimIsResentPromptly(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	if ok, err := e.svc.Park(ctx, event(9400, 100)); err != nil || ok {
		t.Fatalf("Park without a claim = %v, %v; want false", ok, err)
	}
	ev := event(9401, 2500)
	e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1}) // 5xx: nothing taken, the claim pending
	if ok, err := e.svc.Park(ctx, ev); err != nil || !ok {
		t.Fatalf("Park = %v, %v; want true", ok, err)
	}
	// The completer's clock says the claim is fresh (well below After):
	// only its parked-claim passes may send it.
	c := e.completer(t, e.charger, 0)
	pass := func() billing.PassReport {
		t.Helper()
		rep, err := c.RunOnce(ctx, billing.PassOptions{ParkedOnly: true})
		if err != nil {
			t.Fatalf("parked pass: %v", err)
		}
		return rep
	}
	if rep := pass(); len(rep.Settled) != 0 || rep.Unsettled.Parked != 1 {
		t.Fatalf("pass right after parking: %+v; want nothing due yet, 1 parked", rep)
	}
	e.sim.SetFaults(paysim.Faults{ErrorRate: 1})
	resent := waitSettled(t, pass, "pending")
	t.Logf("re-sent while failing: %+v", resent)
	e.sim.SetFaults(paysim.Faults{})
	settled := waitSettled(t, pass, "charged")
	t.Logf("settled: %+v", settled)
	if rep := pass(); rep.Unsettled.Parked != 0 || rep.Unsettled.Pending != 0 {
		t.Fatalf("after the charge: %+v; want nothing parked or pending", rep.Unsettled)
	}
	e.assertChargedOnce(t, ev)
}

// waitSettled runs pass until it settles a claim with result want; bounded.
func waitSettled(t *testing.T, pass func() billing.PassReport, want string) billing.Settled {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, s := range pass().Settled {
			if s.Result == want {
				return s
			}
		}
	}
	t.Fatalf("no parked claim settled as %s within 20 s", want)
	return billing.Settled{}
}

// The park, failed before and after it takes effect, as a lost connection
// and as a crash: whatever the pipeline then believes (parked, or not and
// retrying), a distinct event for the order stays out, the completer and
// the event's redelivery settle the claim, and the order is charged once.
func TestCrashAroundThePark(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(9600)
	for _, after := range []bool{false, true} {
		for _, mode := range []faultMode{connLost, crash} {
			order++
			t.Run(fmt.Sprintf("%s/after=%v", mode, after), func(t *testing.T) {
				ev := event(order, 1200)
				e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
				in := newInjector()
				in.failAt, in.after, in.mode = 0, after, mode
				svc := newService(t, faultDB{e.pool, in}, e.charger)
				parked, err := svc.Park(context.Background(), ev)
				t.Logf("park: %v, %v (ops %q)", parked, err, in.trace())
				if parked && err != nil {
					t.Fatalf("park says both parked and %v", err)
				}
				other := event(order, 1200)
				if res, err := e.svc.Process(context.Background(), other); err == nil || res.Outcome == billing.Charged {
					t.Fatalf("a distinct event meanwhile: %+v, %v; want it busy", res, err)
				}
				e.completePass(t, 2*time.Minute)
				if res, err := settle(context.Background(), t, e.svc, ev); err != nil || (res.Outcome != billing.Charged && res.Outcome != billing.Duplicate) {
					t.Fatalf("redelivery: %+v, %v; want charged or duplicate", res, err)
				}
				if res, err := settle(context.Background(), t, e.svc, other); err != nil || res.Outcome != billing.DuplicateOrder {
					t.Fatalf("the distinct event: %+v, %v; want duplicate_order", res, err)
				}
				e.assertChargedOnce(t, ev)
			})
		}
	}
}
