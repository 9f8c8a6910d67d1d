package billing

// The deferred event's lifecycle, written once (SPEC §11): its states, who
// moves them, and DeferredState.Next, its one pure transition function.
// Two of its rows are decided in SQL alone, with no decision in Go: which
// record Defer stores (deferSQL) and which row TakeDeferred leases
// (takeDeferredSQL) depend on the order's rows at the statement's moment,
// so the statements are the decision, and Next's StepDefer and StepTake
// rows are their guards written as a function — the model checker steps
// through them, and lifecycle_conformance_test.go runs each statement
// from every starting row against them. The third, what a leased row's
// decision does to it, is decided here and carried out by the deciding
// loop (pipeline.Handler.decide).

// DeferredState is the state of a deferred event: its deferred_event row
// (or none), seen with what holds its order.
type DeferredState string

const (
	// DeferredNone: the event has no row: it was never deferred, or its
	// decision is durable and the row deleted. Moved by the pipeline
	// (Defer) or by parking (Park keeps the record in a row waiting on
	// its own claim), to waiting or held.
	DeferredNone DeferredState = "none"
	// DeferredWaiting: stored, behind another event's pending or parked
	// claim, its own parked claim (the completer owns it), or an event
	// deferred before it; or due, nothing holding it any more. Moved by a
	// deciding loop (TakeDeferred), to leased, once nothing holds it.
	DeferredWaiting DeferredState = "waiting"
	// DeferredHeld: stored, behind a blocked claim, another event's or its
	// own. Moved by nothing until an operator decides that claim (SPEC
	// §11 I3): then it is waiting, and decided with the claim.
	DeferredHeld DeferredState = "held"
	// DeferredLeased: taken up by a deciding loop for its lease. Moved by
	// that loop's decision: to none once the decision is durable
	// (FinishDeferred), to waiting when given back (RetryDeferred); when
	// the loop gives up (its context ended, a dead letter not
	// acknowledged) the lease ends, and another loop takes it again.
	DeferredLeased DeferredState = "leased"
)

// DeferredStep is what is asked of a deferred event's lifecycle.
type DeferredStep int

const (
	// StepDefer: the pipeline asks to store the event's record (Defer).
	StepDefer DeferredStep = iota
	// StepTake: a deciding loop asks for the row (TakeDeferred).
	StepTake
	// StepDecided: the leased row's decision came to Decision.
	StepDecided
)

// Decision is what a leased row's decision came to.
type Decision int

const (
	// DecisionDurable: the event is decided and its trace durable — the
	// ledger and processed_event, or an acknowledged dead letter.
	DecisionDurable Decision = iota
	// DecisionGiveBack: not decided yet (its own charge's outcome unknown,
	// a claim blocked or claimed again since the take, a systemic
	// failure): decided again after its backoff.
	DecisionGiveBack
	// DecisionGiveBackUnsent: an operator's pause stopped it before any
	// request: decided again at once once the pause ends.
	DecisionGiveBackUnsent
	// DecisionLeave: the loop gave up (its context ended, or the dead
	// letter was not acknowledged): the lease ends.
	DecisionLeave
)

// DeferredEffect is one thing a deferred event's transition asks for.
type DeferredEffect int

const (
	// DeferredStore: insert the record's row (deferSQL, parkSQL).
	DeferredStore DeferredEffect = iota + 1
	// DeferredCommit: the record is stored (now or by an earlier delivery
	// of the same bytes): the pipeline may commit it.
	DeferredCommit
	// DeferredLease: lease the row to the asking loop (takeDeferredSQL).
	DeferredLease
	// DeferredFinish: delete the row (finishDeferredSQL).
	DeferredFinish
	// DeferredRetry: give the row back after its backoff
	// (retryDeferredSQL); DeferredRetryNow: due at once.
	DeferredRetry
	DeferredRetryNow
)

// DeferredInput is what a deferred event's next state depends on.
type DeferredInput struct {
	Step DeferredStep
	// Claim is the state of the order's claim, ClaimReleased for none;
	// Own says whether it is the event's own.
	Claim ClaimState
	Own   bool
	// Ahead: an event deferred before this one (before its row, or at all
	// when it has none) holds the order.
	Ahead bool
	// Stored: the event has a row with this record's bytes (StepDefer).
	Stored bool
	// LeaseOver: a leased row's lease has ended (StepTake).
	LeaseOver bool
	// Decision is the leased row's decision (StepDecided).
	Decision Decision
}

// Next is the deferred event's transition function:
//
//	state            step      facts                          next, effects
//	any              defer     a row with this record         unchanged, commit
//	any              defer     another's claim unsettled or   waiting (held when the
//	                           blocked, its own blocked, or   claim is blocked),
//	                           an event deferred before       store, commit
//	any              defer     nothing holds the order        unchanged (not stored)
//	waiting, held,   take      no blocked claim, no pending   leased, lease
//	leased (lease              or parked claim of another,
//	over)                      not its own parked, nothing
//	                           deferred before
//	leased           decided   durable                        none, finish
//	leased           decided   give back (unsent)             waiting, retry (now)
//	leased           decided   leave                          leased (the lease ends)
//
// Any other step leaves the state as it is, with no effect.
func (s DeferredState) Next(in DeferredInput) (DeferredState, []DeferredEffect) {
	switch in.Step {
	case StepDefer:
		switch {
		case in.Stored:
			return s, []DeferredEffect{DeferredCommit}
		case in.orderHeld():
			next := DeferredWaiting
			if in.Claim == ClaimBlocked {
				next = DeferredHeld
			}
			if s == DeferredLeased {
				next = s
			}
			return next, []DeferredEffect{DeferredStore, DeferredCommit}
		}
	case StepTake:
		if s == DeferredNone || s == DeferredLeased && !in.LeaseOver || !in.takeable() {
			return s, nil
		}
		return DeferredLeased, []DeferredEffect{DeferredLease}
	case StepDecided:
		if s != DeferredLeased {
			return s, nil
		}
		switch in.Decision {
		case DecisionDurable:
			return DeferredNone, []DeferredEffect{DeferredFinish}
		case DecisionGiveBack:
			return DeferredWaiting, []DeferredEffect{DeferredRetry}
		case DecisionGiveBackUnsent:
			return DeferredWaiting, []DeferredEffect{DeferredRetryNow}
		}
	}
	return s, nil
}

// orderHeld is deferSQL's condition: another event's claim pending,
// parked or blocked, the event's own claim blocked, or an event deferred
// before it.
func (in DeferredInput) orderHeld() bool {
	other := !in.Own && (in.Claim.Unsettled() || in.Claim == ClaimBlocked)
	return other || in.Own && in.Claim == ClaimBlocked || in.Ahead
}

// takeable is takeDeferredSQL's condition: no blocked claim, no pending
// or parked claim of another event, not the event's own parked claim (the
// completer owns it), and no event deferred before it. The event's own
// pending claim does not hold it: that is its own earlier decision, whose
// outcome stayed unknown, re-sent as a redelivery would.
func (in DeferredInput) takeable() bool {
	held := in.Claim == ClaimBlocked || in.Claim.Unsettled() && (!in.Own || in.Claim == ClaimParked)
	return !held && !in.Ahead
}
