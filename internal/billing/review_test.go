package billing_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/paysim"
)

// gatewayNotFound is a client to a gateway in front of the provider that
// answers every charge 404 (a deploy, a wrong route): a definite refusal
// that stores nothing under the key.
func gatewayNotFound(t *testing.T) *payment.Client {
	t.Helper()
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"code":"no_route"}}`, http.StatusNotFound)
	}))
	t.Cleanup(gw.Close)
	c, err := payment.New(payment.Config{BaseURL: gw.URL, Token: "secret-token", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Two deliveries of one event at once (a rebalance: the old owner still
// billing, the new one starting from the committed offset). The first
// creates the claim; its request is refused by something in front of the
// provider (a gateway's 404 during a deploy: a definite refusal, nothing
// stored under the key), so it releases the claim. The second saw the
// claim as its own pending one before the release, and sends the same
// request, which the provider takes. The claim it charged under is gone:
// the order must not be free for a third event to charge again.
func TestRedeliverySendsAfterTheCreatorReleasedTheClaim(t *testing.T) {
	e := newEnv(t, "secret-token")
	gwClient := gatewayNotFound(t)
	ev := event(8101, 1000)
	firstSending, secondPastLookup := make(chan struct{}), make(chan struct{})
	first := newService(t, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		close(firstSending)
		<-secondPastLookup
		return gwClient.ForBilling().Charge(ctx, ch)
	}))
	in := newInjector()
	in.gate = func(_ int, name string) {
		if name == "dedup insert" { // the second delivery decided to charge its own pending claim
			close(secondPastLookup)
		}
	}
	second := newService(t, faultDB{e.pool, in}, e.charger)

	ctx := context.Background()
	firstErr := make(chan error, 1)
	go func() { _, err := first.Process(ctx, ev); firstErr <- err }()
	<-firstSending
	res2, err2 := second.Process(ctx, ev)
	if err := <-firstErr; !fault.Is(err, fault.Permanent) {
		t.Fatalf("first delivery: %v; want permanent (the gateway's 404)", err)
	}
	t.Logf("second delivery: %+v, %v (ops %q)", res2, err2, in.trace())
	if fault.Is(err2, fault.Transient) || fault.Is(err2, fault.Systemic) {
		res2, err2 = settle(ctx, t, e.svc, ev) // the pipeline retries it
		t.Logf("second delivery retried: %+v, %v", res2, err2)
	}
	// A distinct event for the order, from another record key.
	other := event(8101, 1000)
	ores, oerr := settle(ctx, t, e.svc, other)
	t.Logf("other event: %+v, %v", ores, oerr)
	if n := e.sim.ChargesFor(8101); n != 1 {
		t.Fatalf("provider took %d charges for order 8101, want 1", n)
	}
	if err2 != nil || res2.Outcome != billing.Charged {
		t.Fatalf("second delivery: %+v, %v; want charged", res2, err2)
	}
	e.assertChargedOnce(t, ev)
}

// The completer re-sends a claim whose creating attempt is still in flight
// (its claim looks old: a replica's clock behind the completer's, or a
// stalled process). The creator's request is refused by a gateway (a
// definite refusal, nothing stored under the key) and it releases the
// claim while the completer's request, same key, reaches the provider and
// is charged. The order must stay claimed: no other event may charge it.
func TestCompleterSendsWhileTheCreatorReleasesTheClaim(t *testing.T) {
	e := newEnv(t, "secret-token")
	gwClient := gatewayNotFound(t)
	ev := event(8102, 1000)
	firstSending, completerSending, firstDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	first := newService(t, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		close(firstSending)
		<-completerSending
		return gwClient.ForBilling().Charge(ctx, ch)
	}))
	ctx := context.Background()
	go func() { _, err := first.Process(ctx, ev); firstDone <- err }()
	<-firstSending
	var firstErr error
	finished := false
	c := &billing.Completer{Pool: e.pool, After: time.Minute, BlockAfter: time.Hour, Logger: discard(),
		Now: func() time.Time { return now.Add(2 * time.Minute) },
		Charger: chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			close(completerSending)
			// Send once the creator has released (finished) or waits to.
			for deadline := time.Now().Add(20 * time.Second); !finished; {
				select {
				case firstErr = <-firstDone:
					finished = true
					continue
				default:
				}
				if releaseWaits(t, e) {
					break
				}
				if time.Now().After(deadline) {
					t.Error("the creator neither finished nor waits to release after 20 s")
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			return e.charger.Charge(ctx, ch)
		})}
	rep, err := c.RunOnce(ctx, billing.PassOptions{})
	t.Logf("completer pass: %+v, %v", rep.Settled, err)
	if !finished {
		firstErr = <-firstDone
	}
	t.Logf("creator: %v", firstErr)
	other := event(8102, 1000)
	ores, oerr := settle(ctx, t, e.svc, other)
	t.Logf("other event: %+v, %v", ores, oerr)
	if n := e.sim.ChargesFor(8102); n != 1 {
		t.Fatalf("provider took %d charges for order 8102, want 1", n)
	}
	e.assertChargedOnce(t, ev)
}

// releaseWaits reports whether a release of a claim waits on a lock.
func releaseWaits(t *testing.T, e *env) bool {
	t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM charge%'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A claim whose outcome stayed unknown for longer than BlockAfter (the
// service was down, the completer could not run) must be blocked without
// re-sending its request: BlockAfter is kept below the provider's
// retention of idempotency keys precisely because a key the provider has
// forgotten charges again.
func TestCompleterDoesNotResendPastBlockAfter(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(8103, 1000)
	e.sim.SetFaults(paysim.Faults{ResetRate: 1}) // charged; the answer lost
	if _, err := e.svc.Process(context.Background(), ev); !fault.Is(err, fault.Transient) {
		t.Fatalf("first attempt: %v; want transient (outcome unknown)", err)
	}
	// A day later the provider has forgotten the key: model it by a
	// provider that never saw it.
	forgetful := paysim.New(paysim.Config{Token: "secret-token", Seed: 2})
	srv := httptest.NewServer(forgetful)
	defer srv.Close()
	client, err := payment.New(payment.Config{BaseURL: srv.URL, Token: "secret-token", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := &billing.Completer{Pool: e.pool, Charger: client.ForBilling(), After: time.Minute, BlockAfter: time.Hour,
		Now: func() time.Time { return now.Add(25 * time.Hour) }, Logger: discard()}
	rep, err := c.RunOnce(context.Background(), billing.PassOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pass: %+v", rep.Settled)
	if n := e.sim.ChargesFor(8103) + forgetful.ChargesFor(8103); n != 1 {
		t.Fatalf("the provider took %d charges for order 8103, want 1: the completer re-sent a key older than BlockAfter", n)
	}
	if st := e.status(t, 8103); st != "blocked" {
		t.Fatalf("ledger status %q, want blocked", st)
	}
}

// The same for the event's own redelivery: a day after its first attempt
// was charged with the answer lost (the service was down, or the
// credentials rejected for that long), the event comes back. Its claim is
// older than BILLING_CLAIM_BLOCK_AFTER: the request must not be re-sent.
func TestRedeliveryDoesNotResendAClaimPastBlockAfter(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(8104, 1000)
	e.sim.SetFaults(paysim.Faults{ResetRate: 1}) // charged; the answer lost
	if _, err := e.svc.Process(context.Background(), ev); !fault.Is(err, fault.Transient) {
		t.Fatalf("first attempt: %v; want transient (outcome unknown)", err)
	}
	forgetful := paysim.New(paysim.Config{Token: "secret-token", Seed: 2}) // the key forgotten
	srv := httptest.NewServer(forgetful)
	defer srv.Close()
	client, err := payment.New(payment.Config{BaseURL: srv.URL, Token: "secret-token", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	later, err := billing.New(billing.Config{DB: e.pool, Charger: client.ForBilling(), Group: group, Logger: discard(),
		Now: func() time.Time { return now.Add(25 * time.Hour) }, DBTimeout: 5 * time.Second, ClaimBlockAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	res, err := later.Process(context.Background(), ev)
	t.Logf("redelivery a day later: %+v, %v", res, err)
	if n := e.sim.ChargesFor(8104) + forgetful.ChargesFor(8104); n != 1 {
		t.Fatalf("the provider took %d charges for order 8104, want 1: the redelivery re-sent a key older than the block-after limit", n)
	}
	if !fault.Is(err, fault.Conflict) {
		t.Fatalf("redelivery: %v; want conflict (an operator decides)", err)
	}
}

// The steps of a redelivery whose first attempt left its claim pending
// (a 5xx: nothing taken): the claim finds the event's own row, the send is
// recorded (committed) before the charge transaction begins.
var redeliverySteps = []string{"claim", "ledger lookup", "mark sent", "begin", "dedup insert", "charge", "record", "commit"}

// TestCrashAtEveryStepOfARedelivery is TestCrashAtEveryStep for the
// redelivery of an event with a pending claim: every step of its run,
// the record of the send included, failed before and after, as a lost connection
// and as a crash, then a distinct event for the order, the completer and
// the redeliveries; the order is charged once.
func TestCrashAtEveryStepOfARedelivery(t *testing.T) {
	e := newEnv(t, "secret-token")
	t.Run("steps", func(t *testing.T) {
		ev := event(8300, 100)
		e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
		in := newInjector()
		svc := newService(t, faultDB{e.pool, in}, faultCharger{e.charger, in})
		if res, err := svc.Process(context.Background(), ev); err != nil || res.Outcome != billing.Charged {
			t.Fatalf("clean redelivery: %+v, %v", res, err)
		}
		if got := in.trace(); !slices.Equal(got, redeliverySteps) {
			t.Fatalf("redelivery steps = %q, want %q", got, redeliverySteps)
		}
	})
	order := int64(8300)
	for k, step := range redeliverySteps {
		for _, after := range []bool{false, true} {
			for _, mode := range []faultMode{connLost, crash} {
				order++
				t.Run(fmt.Sprintf("%s/%s/after=%v", step, mode, after), func(t *testing.T) {
					ev := event(order, 4321)
					e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
					in := newInjector()
					in.failAt, in.after, in.mode = k, after, mode
					svc := newService(t, faultDB{e.pool, in}, faultCharger{e.charger, in})
					ctx := context.Background()
					res, err := svc.Process(ctx, ev)
					t.Logf("faulty run: %+v, %v (ops %q)", res, err, in.trace())
					if mode == connLost && err != nil {
						if _, err := settle(ctx, t, svc, ev); err != nil && !fault.Is(err, fault.Transient) && !fault.Is(err, fault.Systemic) {
							t.Fatalf("retry after the cut: %v", err)
						}
					}
					fresh := newService(t, e.pool, e.charger)
					other := event(order, 4321)
					ores, oerr := fresh.Process(ctx, other)
					t.Logf("other event meanwhile: %+v, %v", ores, oerr)
					e.completePass(t, 2*time.Minute)
					if res, err = settle(ctx, t, fresh, ev); err != nil || (res.Outcome != billing.Charged && res.Outcome != billing.Duplicate) {
						t.Fatalf("redelivery: %+v, %v; want charged or duplicate", res, err)
					}
					if ores, oerr = settle(ctx, t, fresh, other); oerr != nil || ores.Outcome != billing.DuplicateOrder {
						t.Fatalf("the other event: %+v, %v; want duplicate_order", ores, oerr)
					}
					e.assertChargedOnce(t, ev)
				})
			}
		}
	}
}
