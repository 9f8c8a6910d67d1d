package billing

import (
	"errors"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// modelRules are the service's decisions as the model asks them. Each
// field is a pure function; the production rule set (productionRules)
// is made of the production's own transition functions, and of the SQL
// statements' guards written as functions where the decision lives in a
// statement's WHERE clause. Other rule sets are broken on purpose and
// kept as tests: the rules of 4e65814 before issue 29 (rulesBefore29),
// and single rules broken one at a time, each caught by the checker.
type modelRules struct {
	name string
	// decide is what an existing claim means for an arriving event
	// (ledger.go's decide).
	decide func(row Claim, found bool, ev events.OrderConfirmed, blockAfter time.Duration) (verdict, Outcome, error)
	// next is NextClaimStatus.
	next func(ClaimFacts) ClaimStatus
	// operator is the operator's transition (operator.go).
	operator func(status string, req OperatorRequest) (string, error)
	// operatorMay is the command's guard beyond the transition: the row
	// lock it waits for, the in-flight window it refuses in.
	operatorMay func(w world) bool
	// heldByDeferred is claimSQL's "ahead": an event deferred before i
	// holds the order.
	heldByDeferred func(w world, i int8) bool
	// mayDefer is deferSQL's guard; mayTake is takeDeferredSQL's.
	mayDefer, mayTake func(w world, i int8) bool
	// mayRelease is releaseSQL's guard for attempt by of event i.
	mayRelease func(c claimM, i, by int8) bool
	// recordsSend says whether a send records its in-flight window
	// before the request leaves (created: the attempt created the claim;
	// first: its first send, which the claim's insert records).
	recordsSend func(created, first bool) bool
	// senderWaitsOnPause: the pipeline's attempts (byConsumer) and the
	// deciding loop's (byDecider) check the pause before each request.
	senderWaitsOnPause    func(by int8) bool
	completerWaitsOnPause func() bool
	// policy is the failure policy: the actions allowed after err.
	policy func(w world, i, by int8, err error) []action
	// parkKeeps is what parking keeps beside the claim.
	parkKeeps func(w *world, i int8)
	// strayCharge handles a 2xx for a claim that is not the event's.
	strayCharge func(s *stepper, w world, i, by int8, label string)
}

// action is one thing the failure policy may do with a failed attempt.
type action int8

const (
	actRetry action = iota
	actDeadLetter
	actPark
	actDefer
	actGiveBack
)

// otherClaimUnsettled: the claim is another event's, pending or blocked.
func otherClaimUnsettled(w world, i int8) bool {
	return w.claim.exists && w.claim.owner != i && (w.claim.status == mPending || w.claim.status == mBlocked)
}

// deferredAhead: another event was deferred before i (before i's own row,
// or at all when i has none).
func deferredAhead(w world, i int8) bool {
	for j := range w.n {
		if j != i && w.ev[j].deferred != 0 && (w.ev[i].deferred == 0 || w.ev[j].deferred < w.ev[i].deferred) {
			return true
		}
	}
	return false
}

func parkable(w world, i int8) bool {
	return w.claim.exists && w.claim.owner == i && w.claim.status == mPending
}

// rulesBefore29 are the rules of 4e65814, before issue 29: decideBefore29,
// releases guarded by the row lock alone, no in-flight records, no pause
// check on retries, the completer or the deciding loop's sends, parking
// that keeps nothing but the claim, and a 2xx for a vanished claim
// dead-lettered as a conflict.
func rulesBefore29() modelRules {
	return modelRules{
		name: "before issue 29", decide: decideBefore29, next: NextClaimStatus, operator: nextStatus,
		operatorMay:    func(w world) bool { return w.claim.held == 0 },
		heldByDeferred: deferredAhead,
		mayDefer:       func(w world, i int8) bool { return otherClaimUnsettled(w, i) || deferredAhead(w, i) },
		mayTake:        func(w world, i int8) bool { return !otherClaimUnsettled(w, i) && !deferredAhead(w, i) },
		mayRelease: func(c claimM, i, by int8) bool {
			return c.owner == i && c.creator == by+1 && !c.othersSent && c.status == mPending
		},
		recordsSend:           func(bool, bool) bool { return false },
		senderWaitsOnPause:    func(int8) bool { return false },
		completerWaitsOnPause: func() bool { return false },
		policy:                policyBefore29,
		parkKeeps:             func(*world, int8) {},
		strayCharge: func(s *stepper, w world, i, by int8, label string) {
			s.fail(w, i, by, fault.Errorf(fault.Conflict, "ledger claim vanished"), label+": its claim vanished")
		},
	}
}

// policyBefore29 is pipeline.go's handle (byConsumer) and deferred.go's
// decide (byDecider) before issue 29.
func policyBefore29(w world, i, by int8, err error) []action {
	kind := fault.KindOf(err)
	if by == byDecider {
		switch kind {
		case fault.Invalid, fault.Permanent, fault.Conflict:
			return []action{actDeadLetter}
		}
		return []action{actGiveBack}
	}
	switch kind {
	case fault.Invalid, fault.Permanent, fault.Conflict:
		return []action{actDeadLetter}
	case fault.Busy:
		return []action{actRetry, actDefer}
	}
	if parkable(w, i) {
		return []action{actRetry, actPark}
	}
	return []action{actRetry, actDeadLetter}
}

// decideBefore29 is ledger.go's decide at 4e65814, kept as the broken
// rule the checker catches (defects 2, 3 and 7 of issue 29: a blocked
// claim, another event's or the event's own, dead-letters the event as a
// conflict).
func decideBefore29(row Claim, found bool, ev events.OrderConfirmed, blockAfter time.Duration) (verdict, Outcome, error) {
	own := found && row.OrderID == ev.OrderID && row.EventID == ev.EventID && row.Status == ClaimPending &&
		row.Amount == ev.TotalAmount && row.CustomerID == ev.CustomerID
	if own && NextClaimStatus(ClaimFacts{Answer: AnswerNone, Age: row.Age, BlockAfter: blockAfter}) == ClaimBlocked {
		return verdictBlock, "", fault.Errorf(fault.Conflict, "own claim past block-after")
	}
	switch {
	case !found:
		return verdictReclaim, "", nil
	case row.OrderID != ev.OrderID:
		return verdictDone, "", fault.Errorf(fault.Conflict, "event claimed another order")
	case row.EventID == ev.EventID && (row.Amount != ev.TotalAmount || row.CustomerID != ev.CustomerID):
		return verdictDone, "", fault.Errorf(fault.Conflict, "event claimed the order with other parameters")
	case row.Status == ClaimBlocked:
		return verdictDone, "", fault.Errorf(fault.Conflict, "claim blocked")
	case own:
		return verdictCharge, "", nil
	case row.EventID == ev.EventID:
		return verdictDone, Duplicate, nil
	case row.Status == ClaimPending:
		return verdictDone, "", fault.Errorf(fault.Busy, "claimed by another event")
	case row.Amount != ev.TotalAmount || row.CustomerID != ev.CustomerID:
		return verdictDone, "", fault.Errorf(fault.Conflict, "charged with other parameters")
	default:
		return verdictDone, DuplicateOrder, nil
	}
}

// productionRules are the rules of this code: decide, NextClaimStatus and
// the operator's transition as they are, the statements' guards written
// as functions (deferSQL, takeDeferredSQL, releaseSQL, claimSQL's ahead),
// every sender checking the pause (SPEC §11 I4), an event behind a
// blocked claim deferred at once (ErrHeld), parking that keeps the
// record in a deferred row waiting on its own claim, and every send
// recorded with the operator waiting for it (SPEC §11 I5).
func productionRules() modelRules {
	r := rulesBefore29()
	r.name = "this code"
	r.decide = decide
	r.mayDefer = func(w world, i int8) bool {
		ownBlocked := w.claim.exists && w.claim.owner == i && w.claim.status == mBlocked
		return otherClaimUnsettled(w, i) || ownBlocked || deferredAhead(w, i)
	}
	r.mayTake = func(w world, i int8) bool {
		ownWaits := w.claim.exists && w.claim.owner == i && (w.claim.status == mBlocked || w.claim.status == mPending && w.claim.parked)
		return !otherClaimUnsettled(w, i) && !ownWaits && !deferredAhead(w, i)
	}
	r.senderWaitsOnPause = func(int8) bool { return true }
	r.completerWaitsOnPause = func() bool { return true }
	// Every send, the creator's first (claimSQL) and retries included, is
	// recorded before it leaves (markSent), and the operator refuses while
	// a recorded request may be in flight or still be finished by the
	// provider (checkInFlight: decide_after; SPEC §11 I5).
	r.recordsSend = func(bool, bool) bool { return true }
	r.operatorMay = func(w world) bool {
		return w.claim.held == 0 && !w.inFlight(w.claim.owner, true) && !w.recordedUnsent(w.claim.owner)
	}
	r.policy = policy
	r.parkKeeps = func(w *world, i int8) {
		if w.ev[i].deferred == 0 {
			w.ev[i].deferred = w.lastDeferred() + 1
		}
	}
	return r
}

// policy is pipeline.go's handle (byConsumer) and deferred.go's decide
// (byDecider): a held event is deferred at once.
func policy(w world, i, by int8, err error) []action {
	if by == byConsumer && errors.Is(err, ErrHeld) {
		return []action{actDefer, actRetry}
	}
	return policyBefore29(w, i, by, err)
}
