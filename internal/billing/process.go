package billing

import (
	"context"
	"errors"
	"sync"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// The phases of processing, for Service.Process (one event) and the
// Batcher (many) alike, in the order the files call each other: this file
// runs claimAll (ledger.go: the claims, committed; whether each event's
// own claim is sent is the claim's transition function's,
// ClaimState.Next, asked by claimWon and decide) and chargeAll
// (charge.go: the charge transaction, which asks Next about the pause
// before the requests and about each answer: a 2xx's record, and
// settleFailed for what failed); charge.go uses ledger.go's
// statements (lookup, markSent, release, block); ledger.go calls neither.
// What finishes an event later lives apart: the Completer (completer.go)
// settles stale claims and, with park.go, parked ones; deferred.go stores
// the deferred events, which pipeline.Handler.DecideDeferred decides (it
// writes their dead letters).

// processAll bills evs together: one claim statement for all of them,
// then one charge transaction for those to charge, and answers each event,
// in order. An event outside the processed_event partitions makes
// the charge phase fall back to one transaction per event, each deciding
// alone whether it needs the ledger alone.
//
// attempts[i] is the attempt batch[i] belongs to (see WithAttempt). The
// charges run on pool (nil: a goroutine each).
func (s *Service) processAll(ctx context.Context, batch []events.OrderConfirmed, attempts []*attempt, pool *workers) []response {
	out := s.processOnce(ctx, batch, attempts, pool)
	// An event whose claim moved between its lookup and the record of its
	// send (its own earlier delivery just charged it, or its creator
	// released it) is decided again: a duplicate or a fresh claim, at once.
	for range 2 {
		var again []int
		for i, r := range out {
			if errors.Is(r.err, errMovedMeanwhile) {
				again = append(again, i)
			}
		}
		if len(again) == 0 {
			break
		}
		evs, atts := make([]events.OrderConfirmed, len(again)), make([]*attempt, len(again))
		for k, i := range again {
			evs[k], atts[k] = batch[i], attempts[i]
		}
		for k, r := range s.processOnce(ctx, evs, atts, pool) {
			out[again[k]] = r
		}
	}
	return out
}

// processOnce is one round of processAll.
func (s *Service) processOnce(ctx context.Context, batch []events.OrderConfirmed, attempts []*attempt, pool *workers) []response {
	out := make([]response, len(batch))
	if s.paused() {
		return pausedAll(batch, out)
	}
	// The same event twice in one batch (a redelivery beside its
	// original): the later copy waits for the earlier one's outcome.
	n := len(batch)
	evs, atts := make([]events.OrderConfirmed, 0, n), make([]*attempt, 0, n)
	at := make([]int, 0, n) // batch index of each of evs
	seen := make(map[uuid.UUID]bool, n)
	for i, ev := range batch {
		if seen[ev.EventID] {
			out[i].err = fault.Errorf(fault.Busy, "event %s is being billed by another delivery", ev.EventID)
			continue
		}
		seen[ev.EventID] = true
		evs, atts, at = append(evs, ev), append(atts, attempts[i]), append(at, i)
	}
	toCharge, created, recorded := make([]events.OrderConfirmed, 0, n), make([]bool, 0, n), make([]bool, 0, n)
	chargeAtts, chargeAt := make([]*attempt, 0, n), make([]int, 0, n)
	// Fixed before the claim statement records the first sends (SPEC §11
	// I5): no request of this round leaves after it.
	deadline := s.sends.deadline()
	for k, c := range s.claimAll(ctx, evs, atts) {
		if !c.charge {
			out[at[k]] = response{c.res, c.err}
			continue
		}
		toCharge, chargeAt = append(toCharge, evs[k]), append(chargeAt, at[k])
		created, recorded, chargeAtts = append(created, c.created), append(recorded, c.recorded), append(chargeAtts, atts[k])
	}
	if len(toCharge) == 0 {
		return out
	}
	charged, err := s.chargeAll(ctx, toCharge, created, recorded, deadline, chargeAtts, true, pool)
	switch {
	case errors.Is(err, ErrNoPartition):
		var wg sync.WaitGroup
		for k, ev := range toCharge {
			wg.Add(1)
			pool.run(func() {
				defer wg.Done()
				res, err := s.charge(ctx, ev, created[k], chargeAtts[k], true)
				if errors.Is(err, ErrNoPartition) {
					s.logger.WarnContext(ctx, "event outside dedup partitions, ledger decides", "event_id", ev.EventID, "order_id", ev.OrderID)
					res, err = s.charge(ctx, ev, created[k], chargeAtts[k], false)
					res.DedupBypassed = true
				}
				out[chargeAt[k]] = response{res, err}
			})
		}
		wg.Wait()
	case err != nil:
		for _, i := range chargeAt {
			out[i].err = err
		}
	default:
		for k, r := range charged {
			out[chargeAt[k]] = r
		}
	}
	return out
}
