package billing_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// Tests of the block-after rule: a claim older than
// BILLING_CLAIM_BLOCK_AFTER is never re-sent, by anyone.

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
	e.age(t, 25*time.Hour)
	c := &billing.Completer{Sessions: postgres.NewSessions(postgres.FromPool(e.pool)), Charger: client.ForBilling(), After: time.Minute, BlockAfter: time.Hour,
		Now: func() time.Time { return now }, Logger: discard()}
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
// older than BILLING_CLAIM_BLOCK_AFTER: the request must not be re-sent,
// and the event is held behind its own claim, now blocked (defect 7 of
// issue 29: it was a conflict, dead-lettered, and lost after a release).
func TestRedeliveryDoesNotResendAClaimPastBlockAfter(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
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
		e.age(t, 25*time.Hour)
		later, err := billing.New(billing.Config{Store: postgres.NewStoreOn(e.pool), Charger: client.ForBilling(), Group: group, Logger: discard(),
			Now: func() time.Time { return now }, DBTimeout: 5 * time.Second, ClaimBlockAfter: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.billerOf(t, k, later).Process(context.Background(), ev)
		t.Logf("redelivery a day later: %+v, %v", res, err)
		if n := e.sim.ChargesFor(8104) + forgetful.ChargesFor(8104); n != 1 {
			t.Fatalf("the provider took %d charges for order 8104, want 1: the redelivery re-sent a key older than the block-after limit", n)
		}
		// Held behind its own claim, now blocked: deferred and decided with
		// the claim after the operator's decision, never a conflict (SPEC
		// §11, I3); a later redelivery finds the claim blocked: held again.
		if !fault.Is(err, fault.Busy) || !errors.Is(err, billing.ErrHeld) {
			t.Fatalf("redelivery: %v; want held (busy, ErrHeld): an operator decides", err)
		}
		if st := e.status(t, 8104); st != "blocked" {
			t.Fatalf("claim %q; want blocked", st)
		}
		if _, err := e.billerOf(t, k, later).Process(context.Background(), ev); !fault.Is(err, fault.Busy) || !errors.Is(err, billing.ErrHeld) {
			t.Fatalf("redelivery behind its own blocked claim: %v; want held", err)
		}
	})
}
