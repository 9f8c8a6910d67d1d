package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// pendingClaim leaves ev's order claimed, pending, by a charge whose
// outcome is unknown: with faults f at the provider.
func (e *env) pendingClaim(t *testing.T, ev events.OrderConfirmed, f paysim.Faults) {
	t.Helper()
	e.sim.SetFaults(f)
	defer e.sim.SetFaults(paysim.Faults{})
	if _, err := e.svc.Process(context.Background(), ev); !fault.Is(err, fault.Transient) {
		t.Fatalf("charge under %+v: %v; want transient (outcome unknown)", f, err)
	}
	if st := e.status(t, ev.OrderID); st != "pending" {
		t.Fatalf("ledger status %q, want pending", st)
	}
}

// completer returns a completer over c; the unsettled claims are aged by
// age first (the database's clock is the one ages are read from).
func (e *env) completer(t *testing.T, c billing.Charger, age time.Duration) *billing.Completer {
	t.Helper()
	e.age(t, age)
	return &billing.Completer{Sessions: postgres.NewSessions(postgres.FromPool(e.pool)), Charger: c, After: time.Minute, BlockAfter: time.Hour,
		Now: func() time.Time { return now }, Logger: discard()}
}

// The provider took the charge and the answer was lost: the completer
// re-sends the same request, gets the stored answer and records it. A
// fresh claim is left to its event.
func TestCompleterSettlesWhatTheProviderTook(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(9001, 1234)
	e.pendingClaim(t, ev, paysim.Faults{ResetRate: 1})

	rep, err := e.completer(t, e.charger, 30*time.Second).RunOnce(context.Background(), billing.PassOptions{})
	if err != nil || !rep.Counted || len(rep.Settled) != 0 || rep.Unsettled.Pending != 1 ||
		rep.Unsettled.OldestPending < 30*time.Second || rep.Unsettled.OldestPending > 40*time.Second {
		t.Fatalf("pass at 30s: %+v, %v; want nothing settled, 1 pending for 30s", rep, err)
	}
	rep, err = e.completer(t, e.charger, 2*time.Minute).RunOnce(context.Background(), billing.PassOptions{})
	if err != nil || len(rep.Settled) != 1 || rep.Settled[0].Result != "charged" || rep.Unsettled != (billing.Unsettled{}) {
		t.Fatalf("pass at 2m: %+v, %v; want one charged, nothing left", rep, err)
	}
	if e.sim.Replays() != 1 {
		t.Fatalf("provider replays %d, want 1: the completer must re-send the same key and body", e.sim.Replays())
	}
	e.assertChargedOnce(t, ev)
	// The event's redelivery is a duplicate.
	if res, err := e.svc.Process(context.Background(), ev); err != nil || res.Outcome != billing.Duplicate {
		t.Fatalf("redelivery: %+v, %v; want duplicate", res, err)
	}
}

// What the completer cannot settle it blocks, never releases: a 422, a
// refusal of its own request (it did not create the claim), an outcome
// unknown past BlockAfter. An outcome still unknown before that stays
// pending, counted.
func TestCompleterBlocksWhatItCannotSettle(t *testing.T) {
	e := newEnv(t, "secret-token")
	conflict, declined, unknown, stale := event(9101, 100), event(9102, 200), event(9103, 300), event(9104, 400)
	for _, ev := range []events.OrderConfirmed{conflict, declined, unknown, stale} {
		e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1}) // 500: nothing taken, nothing stored
	}
	// The provider knows conflict's key with another body.
	if _, err := e.client.Charge(context.Background(), payment.Charge{IdempotencyKey: conflict.EventID.String(),
		OrderID: 9101, CustomerID: 42, Amount: 999}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), "UPDATE charge SET claimed_at = claimed_at - interval '2 hours' WHERE order_id = 9104"); err != nil {
		t.Fatal(err)
	}
	e.sim.SetFaults(paysim.Faults{Decline: func(o int64) bool { return o == 9102 }})
	failing := chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		if ch.OrderID == 9103 || ch.OrderID == 9104 {
			return billing.ChargeResult{}, fault.Errorf(fault.Transient, "timeout")
		}
		return e.charger.Charge(ctx, ch)
	})
	rep, err := e.completer(t, failing, 2*time.Minute).RunOnce(context.Background(), billing.PassOptions{ListBlocked: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{9101: "blocked", 9102: "blocked", 9103: "pending", 9104: "blocked"}
	for order, st := range want {
		if got := e.status(t, order); got != st {
			t.Errorf("order %d: status %q, want %q", order, got, st)
		}
	}
	if rep.Unsettled.Blocked != 3 || rep.Unsettled.Pending != 1 || len(rep.Blocked) != 3 {
		t.Errorf("report %+v; want 3 blocked (listed), 1 pending", rep.Unsettled)
	}
	var attempts int
	if err := e.pool.QueryRow(context.Background(), "SELECT settle_attempts FROM charge WHERE order_id = 9103").Scan(&attempts); err != nil || attempts != 1 {
		t.Errorf("settle attempts of the unknown claim = %d, %v; want 1", attempts, err)
	}
	if n := e.sim.ChargesFor(9102) + e.sim.ChargesFor(9103) + e.sim.ChargesFor(9104); n != 0 {
		t.Errorf("the provider took %d charges for orders it never charged", n)
	}
	// Another event for a blocked order is held behind the claim, decided
	// with the operator's decision (SPEC §11, I3), not a conflict.
	if _, err := e.svc.Process(context.Background(), event(9102, 200)); !fault.Is(err, fault.Busy) || !errors.Is(err, billing.ErrHeld) {
		t.Errorf("another event for a blocked order: %v; want held (busy, ErrHeld)", err)
	}
}

// A dry run sends nothing and changes nothing; a pass while another
// process holds the completer's lock settles nothing.
func TestCompleterDryRunAndLock(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(9201, 500)
	e.pendingClaim(t, ev, paysim.Faults{ResetRate: 1})
	requests := 0
	counting := chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		requests++
		return e.charger.Charge(ctx, ch)
	})
	rep, err := e.completer(t, counting, 2*time.Minute).RunOnce(context.Background(), billing.PassOptions{DryRun: true})
	if err != nil || len(rep.Settled) != 1 || rep.Settled[0].Result != "would re-send" || requests != 0 || e.status(t, 9201) != "pending" {
		t.Fatalf("dry run: %+v, %v, %d requests, status %q", rep, err, requests, e.status(t, 9201))
	}
	conn, err := e.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const completerLock = 0x636f6d706c657465 // "complete"
	if _, err := conn.Exec(context.Background(), "SELECT pg_advisory_lock($1)", int64(completerLock)); err != nil {
		t.Fatal(err)
	}
	rep, err = e.completer(t, counting, 2*time.Minute).RunOnce(context.Background(), billing.PassOptions{})
	if err != nil || !rep.Skipped || requests != 0 || rep.Unsettled.Pending != 1 {
		t.Fatalf("pass under another's lock: %+v, %v, %d requests; want skipped, counts still read", rep, err, requests)
	}
	if _, err := conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", int64(completerLock)); err != nil {
		t.Fatal(err)
	}
	if rep, err = e.completer(t, counting, 2*time.Minute).RunOnce(context.Background(), billing.PassOptions{}); err != nil || rep.Skipped || requests != 1 {
		t.Fatalf("pass after the lock: %+v, %v, %d requests", rep, err, requests)
	}
	e.assertChargedOnce(t, ev)
}

// Ages are the database's clock (SPEC §10): a claim made by a replica
// whose clock runs two hours ahead is not hidden from a completer with the
// right time (on b522a65, claimed_at was the replica's clock, so the claim
// looked two hours younger than it was and was never settled), and one
// made by a replica two hours behind is not blocked as too old at once.
func TestSkewedReplicaClocksAgreeOnClaimAges(t *testing.T) {
	for _, skew := range []time.Duration{2 * time.Hour, -2 * time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			e := newEnv(t, "secret-token")
			ev := event(9500, 700)
			skewed, err := billing.New(billing.Config{Store: postgres.NewStoreOn(e.pool), Charger: e.charger, Group: group, Logger: discard(),
				Now: func() time.Time { return time.Now().Add(skew) }, DBTimeout: 5 * time.Second, ClaimBlockAfter: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			e.sim.SetFaults(paysim.Faults{ResetRate: 1}) // taken, the answer lost: the claim stays pending
			if _, err := skewed.Process(context.Background(), ev); !fault.Is(err, fault.Transient) {
				t.Fatalf("charge: %v; want transient", err)
			}
			e.sim.SetFaults(paysim.Faults{})
			c := &billing.Completer{Sessions: postgres.NewSessions(postgres.FromPool(e.pool)), Charger: e.charger, After: time.Second, BlockAfter: time.Hour,
				Now: time.Now, Logger: discard()}
			var rep billing.PassReport
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				if rep, err = c.RunOnce(context.Background(), billing.PassOptions{}); err != nil {
					t.Fatal(err)
				}
				if len(rep.Settled) > 0 {
					break
				}
			}
			if len(rep.Settled) != 1 || rep.Settled[0].Result != "charged" {
				t.Fatalf("clock %v off: completer passes settled %+v within 10 s; want the claim charged once it is a second old", skew, rep.Settled)
			}
			e.assertChargedOnce(t, ev)
		})
	}
}
