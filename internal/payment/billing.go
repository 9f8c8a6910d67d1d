package payment

import (
	"context"

	"github.com/billing-consumer/billing-consumer/internal/billing"
)

// ForBilling returns c as billing's port, billing.Charger: each Charge is
// one Client.Charge of the same request, and its error is Client.Charge's
// own, unwrapped, so that billing reads the fault.Kind and
// (*Error).NotTaken through it. The adapter lives here, not in billing, so
// that the use case does not depend on the HTTP client.
func (c *Client) ForBilling() billing.Charger { return billingPort{c} }

type billingPort struct{ c *Client }

func (p billingPort) Charge(ctx context.Context, req billing.ChargeRequest) (billing.ChargeResult, error) {
	// A conversion, not a field-by-field copy: it stops compiling the day
	// the two requests differ.
	res, err := p.c.Charge(ctx, Charge(req))
	if err != nil {
		return billing.ChargeResult{}, err
	}
	return billing.ChargeResult{ChargeID: res.ChargeID}, nil
}
