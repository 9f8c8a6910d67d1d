package billing

import (
	"errors"
	"slices"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/policy"
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
	// next is the claim's transition function (ClaimState.Next), for the
	// senders, a stray 2xx and the operator alike.
	next func(ClaimState, ClaimInput) (ClaimState, []Effect, error)
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
	// parkKeeps is what parking keeps beside the claim of event i's
	// record of count rec.
	parkKeeps func(w *world, i, rec int8)
	// strayCharge handles a 2xx for a claim that is not the event's.
	strayCharge func(s *stepper, w world, i, by int8, label string)
	// decided is claimSQL's answer from dead_letter for event i's record
	// of dlq-replay-count count: the reason (a dlq bit) to dead-letter it
	// with at once, or 0 to claim; keeps is recordDeadLetterSQL's: the
	// reason stored before that a new dead letter keeps, or 0 (the new
	// one is stored).
	decided, keeps func(w world, i, count int8) uint8
	// spends is claimSQL's rp: what the claim statement of event i's
	// record of count count leaves of the stored decision.
	spends func(w *world, i, count int8)
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

// owns is recordSQL's guard: the claim is event i's, whatever its status
// (a 2xx for its key is the truth about the money).
func owns(c claimM, i int8) bool { return c.exists && c.owner == i }

// ownPending is the guard of markSentSQL, blockSQL and releaseSQL's row
// (the event's own claim, still pending); parkable is parkSQL's.
func ownPending(c claimM, i int8) bool { return owns(c, i) && c.status == mPending }

func parkable(w world, i int8) bool { return ownPending(w.claim, i) }

// rulesBefore29 are the rules of 4e65814, before issue 29: decideBefore29,
// releases guarded by the row lock alone, no in-flight records, no pause
// check on retries, the completer or the deciding loop's sends, parking
// that keeps nothing but the claim, and a 2xx for a vanished claim
// dead-lettered as a conflict.
func rulesBefore29() modelRules {
	return modelRules{
		name: "before issue 29", decide: decideBefore29, next: ClaimState.Next,
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
		parkKeeps:             func(*world, int8, int8) {},
		strayCharge: func(s *stepper, w world, i, by int8, label string) {
			s.fail(w, i, by, fault.Errorf(fault.Conflict, "ledger claim vanished"), label+": its claim vanished")
		},
		decided: noDecision,
		keeps:   noDecision,
		spends:  keepsAll,
	}
}

// noDecision: a dead letter is no durable decision (before migration
// 00012): every delivery decides afresh.
func noDecision(world, int8, int8) uint8 { return 0 }

// keepsAll: the claim statement leaves the stored decision as it is (the
// rule before the replay spent it: a late original record after the
// replay is answered by the spent dead letter).
func keepsAll(*world, int8, int8) {}

// spendsOlder is claimSQL's rp: a replayed record leaves the row at its
// count without a decision (ReplayedReason) when it held none or one of a
// lower count.
func spendsOlder(w *world, i, count int8) {
	if e := &w.ev[i]; count > 0 && (e.decision == 0 || e.decidedAt < count) {
		e.decision, e.decidedAt = decisionSpent, count
	}
}

// deletesOlder is a broken spends, kept as a test: the replayed record's
// claim deletes an older decision, so that a late original record, decided
// afresh while the replay waits (deferred, or its process died), stores
// its dead letter at its own count, and the replay, decided afresh again,
// may write another reason.
func deletesOlder(w *world, i, count int8) {
	if e := &w.ev[i]; e.decision != 0 && e.decidedAt < count {
		e.decision, e.decidedAt = 0, 0
	}
}

// keptDecision is recordDeadLetterSQL's rule: the stored reason stays
// unless the record was replayed more often or the row holds no decision
// (spent).
func keptDecision(w world, i, count int8) uint8 {
	if e := w.ev[i]; e.decision != 0 && e.decision != decisionSpent && e.decidedAt >= count {
		return e.decision
	}
	return 0
}

// answeredByDecision is claimSQL's dl: the kept decision answers the record,
// unless the event's own claim is charged (the money decides).
func answeredByDecision(w world, i, count int8) uint8 {
	if owns(w.claim, i) && w.claim.status == mCharged {
		return 0
	}
	return keptDecision(w, i, count)
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
	own := found && row.OrderID == ev.OrderID && row.EventID == ev.EventID && row.Status.Unsettled() &&
		row.Amount == ev.TotalAmount && row.CustomerID == ev.CustomerID
	if next, _, _ := row.Status.Next(ClaimInput{Actor: ActorEvent, Age: row.Age, BlockAfter: blockAfter}); own && next == ClaimBlocked {
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
	case row.Status.Unsettled():
		return verdictDone, "", fault.Errorf(fault.Busy, "claimed by another event")
	case row.Amount != ev.TotalAmount || row.CustomerID != ev.CustomerID:
		return verdictDone, "", fault.Errorf(fault.Conflict, "charged with other parameters")
	default:
		return verdictDone, DuplicateOrder, nil
	}
}

// productionRules are the rules of this code: decide and the claim's
// transition function (ClaimState.Next, the operator's moves included) as
// they are, deferSQL's and takeDeferredSQL's guards as the deferred
// event's transition function (DeferredState.Next) says, the other
// statements' guards written as functions (releaseSQL, claimSQL's ahead),
// every sender checking the pause (SPEC §11 I4), the failure policy
// (policy.Decide: an event behind a blocked claim deferred at once),
// parking that keeps the record in a deferred row waiting on its own
// claim, and every send recorded with the operator waiting for it (SPEC
// §11 I5), and a 2xx for a claim gone or another event's recorded as a
// stray charge (the 2xx rule).
func productionRules() modelRules {
	r := rulesBefore29()
	r.name = "this code"
	r.decide = decide
	// deferSQL also answers true for a record it stored before, held or
	// not: a redelivery of a deferred record is committed as deferred, its
	// row decides it. The model does not tell that record from another of
	// the event (a replayed dead letter, which the statement stores only
	// while the order is held): it lets both through whenever the event
	// has its row, more than the statement does, never less
	// (lifecycle_conformance_test.go).
	r.mayDefer = func(w world, i int8) bool {
		_, effects := deferredState(w, i).Next(deferredInput(w, i, StepDefer))
		return slices.Contains(effects, DeferredCommit)
	}
	r.mayTake = func(w world, i int8) bool {
		next, _ := deferredState(w, i).Next(deferredInput(w, i, StepTake))
		return next == DeferredLeased
	}
	r.senderWaitsOnPause = func(int8) bool { return true }
	r.completerWaitsOnPause = func() bool { return true }
	r.policy = func(w world, i, by int8, err error) []action { return decidePolicy(w, i, by, err, r.mayDefer) }
	// Every send, the creator's first (claimSQL) and retries included, is
	// recorded before it leaves (markSent), and the operator refuses while
	// a recorded request may be in flight or still be finished by the
	// provider (InFlightFacts: decide_after; SPEC §11 I5).
	r.recordsSend = func(bool, bool) bool { return true }
	r.operatorMay = func(w world) bool {
		return w.claim.held == 0 && !w.inFlight(w.claim.owner, true) && !w.recordedUnsent(w.claim.owner)
	}
	r.parkKeeps = func(w *world, i, rec int8) {
		if w.ev[i].deferred == 0 {
			w.ev[i].deferred, w.ev[i].deferredRec = w.lastDeferred()+1, rec
		}
	}
	r.strayCharge = strayCharge
	// A valid event's dead letter is recorded before it is written, and
	// answers every later delivery of a record replayed no more often
	// (migration 00012, SPEC §11 I2) until a replay's claim spends it.
	r.decided, r.keeps = answeredByDecision, keptDecision
	// A replayed record's claim spends the older decision (SPEC §11 I2):
	// a late original record is decided afresh, and the event's next dead
	// letter is stored at the replay's count.
	r.spends = spendsOlder
	return r
}

// deferredState is event i's deferred state as far as the model needs it:
// a row (waiting: held or not is the input's to say) or none.
func deferredState(w world, i int8) DeferredState {
	if w.ev[i].deferred != 0 {
		return DeferredWaiting
	}
	return DeferredNone
}

// deferredInput is the deferred lifecycle's question about event i in w.
// Stored is whether i has a row at all: the model does not tell one record
// of an event from another (see mayDefer).
func deferredInput(w world, i int8, step DeferredStep) DeferredInput {
	in := DeferredInput{Step: step, Claim: ClaimReleased, Ahead: deferredAhead(w, i), Stored: w.ev[i].deferred != 0}
	if w.claim.exists {
		in.Claim, in.Own = w.claim.state(), w.claim.owner == i
	}
	return in
}

// strayCharge is the 2xx rule (SPEC §11, recordStray): a 2xx for event
// i whose claim is gone or another event's is recorded (claim.strays),
// the order's row moves as the claim's transition function says for a
// stray 2xx (ActorStray), and the event is charged.
func strayCharge(s *stepper, w world, i, by int8, label string) {
	current := ClaimReleased
	if w.claim.exists {
		current = w.claim.state()
	}
	n := w
	next, _, _ := s.r.next(current, ClaimInput{Actor: ActorStray})
	switch {
	case !w.claim.exists:
		n.claim = claimM{exists: true, owner: i, status: mstatusOf(next)}
	default:
		n.claim.status = mstatusOf(next)
	}
	n.claim.strays = min(n.claim.strays+1, 2)
	s.finish(n, i, by, outCharged, label+": a stray charge, recorded; the claim "+string(current)+" -> "+string(next))
}

// modelPolicy is the failure policy's configuration in the model: its
// figures only place the three moments below.
var modelPolicy = policy.Config{MaxAttempts: 3, RetryBudget: 10 * time.Minute, ParkAfter: time.Minute}

// decidePolicy asks policy.Decide, the pipeline's and the deciding loop's
// one failure policy, what to do with err at three moments of the
// event's life — its first failure, past ParkAfter, past the whole retry
// budget — since the model has no clock: each answer is a step. A Park
// or a Defer that the ledger refuses (mayDefer, parkable) is asked again
// as failed, as the pipeline does.
func decidePolicy(w world, i, by int8, err error, mayDefer func(world, int8) bool) []action {
	asker := policy.Handler
	if by == byDecider {
		asker = policy.Decider
	}
	base := policy.Failure{By: asker, Kind: fault.KindOf(err), Held: errors.Is(err, ErrHeld)}
	past := base
	past.Attempts, past.Spent, past.Waited = 1, modelPolicy.ParkAfter, modelPolicy.ParkAfter
	spent := base
	spent.Attempts, spent.Spent, spent.Waited = modelPolicy.MaxAttempts, modelPolicy.RetryBudget, modelPolicy.RetryBudget
	var out []action
	for _, f := range []policy.Failure{base, past, spent} {
		a := policy.Decide(modelPolicy, f)
		if a == policy.Park && !parkable(w, i) {
			f.ParkFailed = true
			a = policy.Decide(modelPolicy, f)
		}
		if a == policy.Defer && !mayDefer(w, i) {
			f.DeferFailed = true
			a = policy.Decide(modelPolicy, f)
		}
		if act := modelAction(a); !slices.Contains(out, act) {
			out = append(out, act)
		}
	}
	return out
}

// modelAction is the model's step for a policy action: waiting, stalling
// and retrying are all a retry (the model has no clock), the deciding
// loop's give-backs one give-back.
func modelAction(a policy.Action) action {
	switch {
	case a.Reason() != "":
		return actDeadLetter
	case a == policy.Park:
		return actPark
	case a == policy.Defer:
		return actDefer
	case a == policy.GiveBack, a == policy.GiveBackAndStop, a == policy.GiveBackUnsent, a == policy.Leave:
		return actGiveBack
	}
	return actRetry
}
