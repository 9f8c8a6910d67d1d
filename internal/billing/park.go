package billing

import (
	"context"
	"slices"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/events"
)

// Parking (SPEC §10): an event that keeps failing transiently while the
// provider charges other events must not hold its partition. Its pending
// claim already holds everything its charge needs (key, customer,
// canonical amount), so the pipeline parks it — Park marks the claim
// parked and, in the same statement, keeps the record in deferred_event,
// a row waiting on its own claim — and commits its record; from then on
// the Completer owns the
// claim and re-sends its request on a backoff of its own, starting at
// seconds (parkedBackoff), until it is charged, blocked, or past
// BILLING_CLAIM_BLOCK_AFTER. Parking changes who sends, never what: the
// same key and body, and the claim's lifecycle is ClaimState.Next's as for
// any other claim: ClaimParked, derived from parked_at by the scan (the
// status column stays pending, which the previous release reads), whose
// park row parkSQL's guard keeps (a pending claim of the event); the
// completer is ActorCompleter, and the parked event's attempt is over, so
// nothing releases the claim any more.
//
// The kept record is the event's path when the completer cannot charge
// (SPEC §11, I3): the deciding loop leaves the row while the claim is
// pending or blocked (deferred.go, takeDeferredSQL); once the completer
// charged it, or an operator marked it charged, the row is decided as a
// Duplicate and deleted; once an operator released it (a definite refusal
// blocked it: the completer may not release), the row is decided as a
// fresh attempt, whose refusal dead-letters the original record
// `permanent`, replayable.

// firstParkedSend is how soon after parking the completer first re-sends.
const firstParkedSend = time.Second

// Park hands ev's pending claim to the completer and keeps rec, ev's
// record as consumed, for the decision the completer cannot make. It
// returns true when ev had a pending claim with its body, now parked and
// its record stored: the caller may then commit ev's record. False means ev has no such claim (its claim never
// committed, was settled meanwhile, or carries another body: a conflict
// the next attempt finds): the caller goes on as before, and its next
// attempt decides from the ledger. The error means that nothing changed.
//
// The decision is the claim's transition function's park row
// (ClaimState.Next: an attempt of the event asks to park its unsettled
// claim: parked, EffectPark), which Park carries out with parkSQL; the
// parking attempt need not be the creator (the row is the same for
// both), and parkSQL's guard checks on the row that the claim is still
// the event's and pending. A pause does not stop a park: nothing is sent.
func (s *Service) Park(ctx context.Context, ev events.OrderConfirmed, rec Record) (bool, error) {
	if _, effects, _ := ClaimPending.Next(ClaimInput{Actor: ActorEvent, Park: true}); !slices.Contains(effects, EffectPark) {
		return false, nil
	}
	pctx, cancel := s.live(ctx)
	defer cancel()
	return s.store.Park(pctx, s.group, ev, rec, firstParkedSend)
}

// parkedBackoff is the cap of a parked claim's re-send backoff.
func (c *Completer) parkedBackoff() time.Duration {
	if c.ParkedBackoffMax > 0 {
		return c.ParkedBackoffMax
	}
	return 10 * time.Second
}

// parkedEvery is how often Run looks for parked claims due.
func (c *Completer) parkedEvery() time.Duration {
	if c.ParkedEvery > 0 {
		return c.ParkedEvery
	}
	return time.Second
}
