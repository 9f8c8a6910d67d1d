package billing_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
)

// A request of the attempt that created the claim timed out after the
// provider took the money; the attempt's retry is refused by something in
// front of the provider (a gateway's 404, a WAF's 403, a proxy's 407):
// that refusal says nothing about the first request, so the claim must
// stay. Released, it lets another event for the order charge it again.
func TestRefusalAfterAnUnknownOutcomeOfTheSameAttemptKeepsTheClaim(t *testing.T) {
	e := newEnv(t, "secret-token")
	for k, refusal := range []*payment.Error{
		{Status: 404, Kind: fault.Permanent},
		{Status: 403, Kind: fault.Systemic},
		{Status: 402, Kind: fault.Permanent, Code: "card_declined"},
	} {
		order := int64(9100 + k)
		var calls atomic.Int32
		c := chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			if calls.Add(1) == 1 {
				if _, err := e.charger.Charge(ctx, ch); err != nil {
					t.Fatalf("order %d: first charge: %v", order, err)
				}
				return billing.ChargeResult{}, fault.New(fault.Transient, &payment.Error{Kind: fault.Transient, Err: context.DeadlineExceeded})
			}
			return billing.ChargeResult{}, fault.New(refusal.Kind, refusal)
		})
		svc := newService(t, e.pool, c)
		ev := event(order, 500)
		ctx := billing.WithAttempt(context.Background()) // one delivery and its retries
		if _, err := svc.Process(ctx, ev); !fault.Is(err, fault.Transient) {
			t.Fatalf("order %d, timed out: %v; want transient", order, err)
		}
		if _, err := svc.Process(ctx, ev); err == nil {
			t.Fatalf("order %d, refused retry: no error", order)
		}
		if st := e.status(t, order); st != "pending" {
			t.Errorf("order %d: after a timeout then %d in the same attempt, ledger status %q; want pending (the first request may have taken the money)",
				order, refusal.Status, st)
		}
		other := event(order, 500) // another event for the same order
		if res, err := e.svc.Process(context.Background(), other); err == nil && res.Outcome == billing.Charged {
			t.Errorf("order %d: another event charged it again after %d released the claim: charged twice at the provider", order, refusal.Status)
		}
	}
}

// A 403 can come from a WAF that inspected the provider's response, after
// the provider took the money (ModSecurity's response-phase rules deny
// with 403). It is Systemic: the pipeline retries the same event without
// limit, so a kept claim costs little, and a released one lets another
// event for the order charge it again.
func TestForbiddenKeepsTheClaim(t *testing.T) {
	e := newEnv(t, "secret-token")
	for k, status := range []int{403} {
		order := int64(9200 + k)
		c := chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			if _, err := e.charger.Charge(ctx, ch); err != nil {
				t.Fatalf("order %d: charge: %v", order, err)
			}
			return billing.ChargeResult{}, fault.New(fault.Systemic, &payment.Error{Status: status, Kind: fault.Systemic})
		})
		ev := event(order, 700)
		if _, err := newService(t, e.pool, c).Process(billing.WithAttempt(context.Background()), ev); !fault.Is(err, fault.Systemic) {
			t.Fatalf("order %d, %d: %v; want systemic", order, status, err)
		}
		if st := e.status(t, order); st != "pending" {
			t.Errorf("order %d: after %d, ledger status %q; want pending", order, status, st)
		}
		other := event(order, 700)
		if res, err := e.svc.Process(context.Background(), other); err == nil && res.Outcome == billing.Charged {
			t.Errorf("order %d: another event charged it again after %d released the claim: charged twice at the provider", order, status)
		}
	}
}
