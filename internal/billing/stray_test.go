package billing_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// Tests of SPEC §11's 2xx rule: a 2xx for a claim that was deleted or
// taken by another event meanwhile (a foreign binary, a manual DELETE, a
// provider that outlives its bound) is recorded (stray_charge) and the
// event ends charged, never dead-lettered as a conflict; the order's
// ledger row then says what the money did (the event's own claim,
// charged, when the order had none; another event's pending claim
// blocked for an operator with both charges visible).

// gateCharger holds the victim's first request until release is closed
// (inFlight is closed once it is on its way), then lets the provider take
// it. Every other request goes straight to the provider.
type gateCharger struct {
	e        *env
	victim   string
	once     sync.Once
	inFlight chan struct{}
	release  chan struct{}
}

func newGate(e *env, ev events.OrderConfirmed) *gateCharger {
	return &gateCharger{e: e, victim: ev.EventID.String(), inFlight: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateCharger) Charge(ctx context.Context, req billing.ChargeRequest) (billing.ChargeResult, error) {
	if req.IdempotencyKey == g.victim {
		held := false
		g.once.Do(func() { held = true })
		if held {
			close(g.inFlight)
			select {
			case <-g.release:
			case <-ctx.Done():
				return billing.ChargeResult{}, fault.New(fault.Transient, ctx.Err())
			}
		}
	}
	return g.e.charger.Charge(ctx, req)
}

// outcome is what Process answered.
type outcome struct {
	res billing.Result
	err error
}

// startHeld processes ev on b in the background until its request is held
// in flight by g, and returns where its answer arrives. Bounded.
func startHeld(t *testing.T, b biller, g *gateCharger, ev events.OrderConfirmed) <-chan outcome {
	t.Helper()
	done := make(chan outcome, 1)
	go func() {
		res, err := b.Process(billing.WithAttempt(context.Background()), ev)
		done <- outcome{res, err}
	}()
	select {
	case <-g.inFlight:
	case o := <-done:
		t.Fatalf("event %s answered %+v, %v before its request was held", ev.EventID, o.res, o.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the request was not sent within 10 s")
	}
	return done
}

// await is the answer on done, bounded.
func await(t *testing.T, done <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-done:
		return o
	case <-time.After(20 * time.Second):
		t.Fatal("no answer within 20 s of the provider's")
		return outcome{}
	}
}

// strays returns the provider charge ids of the stray charges recorded
// for (order, event), read from the table.
func (e *env) strays(t *testing.T, order int64, id uuid.UUID) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT provider_charge_id FROM stray_charge WHERE order_id = $1 AND event_id = $2 ORDER BY at", order, id)
	if err != nil {
		t.Fatalf("read stray_charge: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// chargeIDOf is the provider's charge id of order's charge.
func (e *env) chargeIDOf(order int64) string {
	for _, c := range e.sim.Charges() {
		if c.OrderID == order {
			return c.ChargeID
		}
	}
	return ""
}

// A 2xx arrives after the order's claim was deleted (as a foreign binary
// or a manual DELETE would) while the request was in flight: the event
// ends charged, with a claim of its own, charged, and the stray recorded.
func TestA2xxAfterTheClaimWasDeletedIsRecordedCharged(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		ev := event(11001, 4200)
		g := newGate(e, ev)
		done := startHeld(t, e.biller(t, k, e.pool, g), g, ev)
		if _, err := e.pool.Exec(context.Background(), "DELETE FROM charge WHERE order_id = $1", ev.OrderID); err != nil {
			t.Fatal(err)
		}
		close(g.release)
		o := await(t, done)
		t.Logf("the event after its claim was deleted: %+v, %v", o.res, o.err)
		if o.err != nil || o.res.Outcome != billing.Charged {
			t.Fatalf("the event: %+v, %v; want charged (its key was charged)", o.res, o.err)
		}
		var owner uuid.UUID
		if err := e.pool.QueryRow(context.Background(), "SELECT event_id FROM charge WHERE order_id = $1", ev.OrderID).Scan(&owner); err != nil || owner != ev.EventID {
			t.Fatalf("the order's claim: event %s, %v; want a claim of event %s", owner, err, ev.EventID)
		}
		if got := e.strays(t, ev.OrderID, ev.EventID); len(got) != 1 || got[0] != e.chargeIDOf(ev.OrderID) {
			t.Errorf("stray charges recorded %q; want one, with the provider's charge id %q", got, e.chargeIDOf(ev.OrderID))
		}
		if n := e.processedRows(t, ev.EventID); n != 1 {
			t.Errorf("the event has %d processed_event rows; want 1 (decided, charged)", n)
		}
		if res, err := settle(context.Background(), t, e.svc, event(ev.OrderID, 4200)); err != nil || res.Outcome != billing.DuplicateOrder {
			t.Errorf("a second event for the order: %+v, %v; want duplicate_order", res, err)
		}
		e.assertChargedOnce(t, ev)
	})
}

// A 2xx arrives for an order whose claim another event took meanwhile
// (the first claim deleted under the request, a second event's claim
// pending with an unknown outcome): the first event ends charged, the
// second event's claim is blocked for an operator, naming the stray
// charge, which is recorded.
func TestA2xxForAnotherEventsPendingClaimBlocksIt(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		ev := event(11011, 4200)
		g := newGate(e, ev)
		done := startHeld(t, e.biller(t, k, e.pool, g), g, ev)
		ctx := context.Background()
		if _, err := e.pool.Exec(ctx, "DELETE FROM charge WHERE order_id = $1", ev.OrderID); err != nil {
			t.Fatal(err)
		}
		other := event(ev.OrderID, 4200)
		unknown := newService(t, e.pool, chargerFunc(func(context.Context, billing.ChargeRequest) (billing.ChargeResult, error) {
			return billing.ChargeResult{}, fault.Errorf(fault.Transient, "timeout: outcome unknown")
		}))
		if _, err := unknown.Process(billing.WithAttempt(ctx), other); !fault.Is(err, fault.Transient) {
			t.Fatalf("the second event: %v; want transient (its claim pending, outcome unknown)", err)
		}
		close(g.release)
		o := await(t, done)
		t.Logf("the first event: %+v, %v", o.res, o.err)
		if o.err != nil || o.res.Outcome != billing.Charged {
			t.Errorf("the first event: %+v, %v; want charged (its key was charged)", o.res, o.err)
		}
		cl, _, err := billing.ShowClaim(ctx, postgres.NewStoreOn(e.pool), ev.OrderID)
		if err != nil {
			t.Fatal(err)
		}
		if cl.EventID != other.EventID || cl.Status != "blocked" || !strings.Contains(cl.LastError, ev.EventID.String()) {
			t.Errorf("the order's claim: event %s, %s, last error %q; want the second event's, blocked, naming the stray charge of %s",
				cl.EventID, cl.Status, cl.LastError, ev.EventID)
		}
		if got := e.strays(t, ev.OrderID, ev.EventID); len(got) != 1 || got[0] != e.chargeIDOf(ev.OrderID) {
			t.Errorf("stray charges recorded %q; want one, with the provider's charge id %q", got, e.chargeIDOf(ev.OrderID))
		}
		if n := e.sim.ChargesFor(ev.OrderID); n != 1 {
			t.Errorf("the provider took %d charges for the order; want 1", n)
		}
		e.settleCompanions(t)
	})
}
