package billing

import (
	"context"

	"github.com/billing-consumer/billing-consumer/internal/events"
)

// ProcessBatch bills evs as one batch of the Batcher does (one claim
// statement, one charge transaction, the charges in parallel), for the
// contract tests that must place several chosen events in one batch: the
// Batcher's own loop batches whatever happens to be queued. evs[victim]
// runs under ctx's attempt (see WithAttempt); the others are attempts of
// their own. It answers each event, in order.
func ProcessBatch(ctx context.Context, s *Service, evs []events.OrderConfirmed, victim int) ([]Result, []error) {
	atts := make([]*attempt, len(evs))
	for i := range evs {
		atts[i] = &attempt{id: attemptOf(context.Background()).id}
	}
	atts[victim] = attemptOf(ctx)
	out := s.processAll(ctx, evs, atts, nil)
	res, errs := make([]Result, len(out)), make([]error, len(out))
	for i, r := range out {
		res[i], errs[i] = r.res, r.err
	}
	return res, errs
}
