package billing_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// pauseSwitch is a Paused function that finds the pause from its at-th
// call on (0: never), counting its calls: a test places the pause before
// the pass or the claims (at 1), or between them and the request (at 2).
type pauseSwitch struct{ calls, at atomic.Int32 }

func (p *pauseSwitch) paused() bool {
	n := p.calls.Add(1)
	at := p.at.Load()
	return at > 0 && n >= at
}

// pauseFrom resets the count and finds the pause from the at-th call on.
func (p *pauseSwitch) pauseFrom(at int32) { p.calls.Store(0); p.at.Store(at) }

// countingCharger passes every request to c and counts it.
func countingCharger(c billing.Charger, n *atomic.Int32) billing.Charger {
	return chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		n.Add(1)
		return c.Charge(ctx, ch)
	})
}

// An operator's pause stops the completer (SPEC §11 I4): a parked claim
// due for its re-send, and old enough for a full pass too, is not sent
// while paused — neither when the pause is in force as the pass starts
// nor when it comes between the pass's read of the claim and the request.
// The pass says it stopped, its counts are still read, the claim stays
// pending and parked; after the resume the next pass sends it, once.
func TestPausedCompleterSendsNothing(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	ev := event(9451, 2500)
	e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
	if ok, err := e.svc.Park(ctx, ev, recordOf(ev)); err != nil || !ok {
		t.Fatalf("Park = %v, %v; want true", ok, err)
	}
	if _, err := e.pool.Exec(ctx, "UPDATE charge SET next_send_at = now() - interval '1 second' WHERE order_id = $1", ev.OrderID); err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int32
	var pause pauseSwitch
	c := e.completer(t, countingCharger(e.charger, &sent), 2*time.Minute) // past After: a full pass reads it too
	c.Paused = pause.paused
	for _, tc := range []struct {
		name string
		at   int32
		opt  billing.PassOptions
	}{
		{"paused before a parked pass", 1, billing.PassOptions{ParkedOnly: true}},
		{"paused before a full pass", 1, billing.PassOptions{}},
		{"paused between the read and the request", 2, billing.PassOptions{ParkedOnly: true}},
	} {
		pause.pauseFrom(tc.at)
		rep, err := c.RunOnce(ctx, tc.opt)
		if err != nil || !rep.Paused || len(rep.Settled) != 0 || !rep.Counted || rep.Unsettled.Parked != 1 {
			t.Fatalf("%s: pass %+v, %v; want it stopped by the pause, nothing settled, 1 parked counted", tc.name, rep, err)
		}
		if n := sent.Load(); n != 0 {
			t.Fatalf("%s: the completer sent %d requests while paused", tc.name, n)
		}
		if st := e.status(t, ev.OrderID); st != "pending" {
			t.Fatalf("%s: claim %q; want it left pending", tc.name, st)
		}
	}
	pause.pauseFrom(0)
	rep, err := c.RunOnce(ctx, billing.PassOptions{ParkedOnly: true})
	if err != nil || rep.Paused || len(rep.Settled) != 1 || rep.Settled[0].Result != "charged" || sent.Load() != 1 {
		t.Fatalf("pass after the resume: %+v, %v, %d sent; want the claim charged by one request", rep, err, sent.Load())
	}
	e.assertChargedOnce(t, ev)
}

// The pause is checked where the requests leave, not only where the
// pipeline hands an event over (SPEC §11 I4): a batch gathered, or an
// event handed over, before the pause sends nothing after it. Paused as
// the call starts, nothing is claimed; paused between the committed
// claims and the requests, the claim is left pending for the attempt's
// own retry, which after the resume charges it once. Both answer
// ErrPaused.
func TestPauseCaughtBeforeTheRequests(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		var sent atomic.Int32
		var pause pauseSwitch
		svc, err := billing.New(billing.Config{Store: postgres.NewStoreOn(e.pool), Charger: countingCharger(e.charger, &sent), Group: group,
			Now: func() time.Time { return now }, Logger: discard(), DBTimeout: 5 * time.Second, Paused: pause.paused})
		if err != nil {
			t.Fatal(err)
		}
		b := e.billerOf(t, k, svc)
		for i, tc := range []struct {
			name  string
			at    int32
			claim string
		}{
			{"paused before the claims", 1, ""},
			{"paused between the claims and the requests", 2, "pending"},
		} {
			ev := event(int64(9471+i), 1500)
			ctx := billing.WithAttempt(context.Background())
			pause.pauseFrom(tc.at)
			if res, err := b.Process(ctx, ev); !errors.Is(err, billing.ErrPaused) {
				t.Fatalf("%s: Process = %+v, %v; want ErrPaused", tc.name, res, err)
			}
			if n := sent.Load(); n != 0 {
				t.Fatalf("%s: %d requests sent while paused", tc.name, n)
			}
			if st := e.status(t, ev.OrderID); st != tc.claim {
				t.Fatalf("%s: claim %q; want %q", tc.name, st, tc.claim)
			}
			pause.pauseFrom(0)
			if res, err := b.Process(ctx, ev); err != nil || res.Outcome != billing.Charged {
				t.Fatalf("%s: after the resume: %+v, %v; want charged", tc.name, res, err)
			}
			e.assertChargedOnce(t, ev)
			sent.Store(0)
		}
	})
}
