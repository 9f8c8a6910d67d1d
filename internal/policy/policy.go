// Package policy decides what to do with a failed attempt to bill an
// event: retry it, wait, park it, defer it, dead-letter it, give its
// deferred row back, or leave it. Decide is one pure function of the
// failure's facts (its fault.Kind, the event's budget, how long it has
// waited, whether an outage is declared, who asks) and the Config; the
// loops that ask (the pipeline's Handler and its deciding loop) gather
// the facts, carry the Action out and keep the clocks, backoffs and
// outage detection. The lifecycle model checker (internal/billing's
// lifecycle tests) calls the same function, so this package imports
// neither billing nor pipeline: what those packages know (an event held
// behind a blocked claim, an operator's pause) comes in as booleans.
//
// The pipeline's Handler (By == Handler), holding the event's record:
//
//	Invalid, Permanent, Conflict → DeadLetter (reason = the kind)
//	Transient                    → Retry, spending the budget; Park once
//	                               it has failed for ParkAfter; DeadLetter
//	                               "exhausted" once it has failed
//	                               MaxAttempts times and for RetryBudget
//	                               (if it could not be parked)
//	Transient during an outage,
//	Systemic                     → Stall: wait, spending nothing, unready
//	Busy                         → Wait, spending nothing, still ready;
//	                               Defer once it has waited for ParkAfter,
//	                               or at once when it is held behind a
//	                               blocked claim (never dead-lettered:
//	                               SPEC §11, I3)
//	ctx ended                    → Leave, before anything else
//
// The deciding loop (By == Decider), holding a deferred row:
//
//	Invalid, Permanent, Conflict → DeadLetter, and the row is finished
//	ctx ended                    → Leave
//	an operator's pause          → GiveBackUnsent
//	Systemic                     → GiveBackAndStop
//	anything else                → GiveBack (never dead-lettered: the
//	                               event is decided with its claim)
//
// ParkAfter zero parks and defers nothing. A kind this package does not
// know is treated as Transient, as fault.KindOf treats an error without a
// kind.
package policy

import (
	"errors"
	"fmt"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// Config is the failure policy's configuration: the pipeline's
// MaxAttempts, RetryBudget and ParkAfter (BILLING_MAX_ATTEMPTS,
// BILLING_RETRY_BUDGET, BILLING_PARK_AFTER).
type Config struct {
	// MaxAttempts is the least number of counted (transient) failures of
	// an event before it may be dead-lettered as "exhausted". At least 1.
	MaxAttempts int
	// RetryBudget is how long an event must have failed, its counted
	// failures only (Failure.Spent), before it may be dead-lettered as
	// "exhausted". Zero lets MaxAttempts alone decide.
	RetryBudget time.Duration
	// ParkAfter is how long an event fails (the same clock as RetryBudget)
	// before it is parked, and how long it waits on another event's claim
	// before it is deferred. Zero never parks and never defers: a held
	// event then waits until an operator settles the claim.
	ParkAfter time.Duration
}

// Error is a configuration error about one field of Config, named as in
// the struct ("MaxAttempts", ...), so that callers can name the setting
// the user has to fix.
type Error struct {
	Field string
	Err   error
}

func (e *Error) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Validate returns nil for a usable Config, or the errors.Join of one
// *Error for each field that is not.
func (c Config) Validate() error {
	var errs []error
	if c.MaxAttempts < 1 {
		errs = append(errs, &Error{"MaxAttempts", fmt.Errorf("%d, want at least 1", c.MaxAttempts)})
	}
	if c.RetryBudget < 0 {
		errs = append(errs, &Error{"RetryBudget", fmt.Errorf("%v, want 0 or more", c.RetryBudget)})
	}
	if c.ParkAfter < 0 {
		errs = append(errs, &Error{"ParkAfter", fmt.Errorf("%v, want 0 (never park) or more", c.ParkAfter)})
	}
	return errors.Join(errs...)
}

// Asker is who asks Decide, and so who carries the Action out.
type Asker int8

const (
	// Handler is the pipeline's Handler.Handle: it holds the event's Kafka
	// record, uncommitted until the event has an outcome.
	Handler Asker = iota
	// Decider is the pipeline's deciding loop
	// (pipeline.Handler.DecideDeferred): it holds a deferred event's row
	// under a lease.
	Decider
)

func (a Asker) String() string {
	switch a {
	case Handler:
		return "handler"
	case Decider:
		return "decider"
	}
	return fmt.Sprintf("asker(%d)", int(a))
}

// Failure is the facts of one failed attempt at an event, as its asker
// knows them.
type Failure struct {
	By   Asker
	Kind fault.Kind
	// Canceled: the asker's context ended (shutdown, a lost partition, a
	// lease's timeout).
	Canceled bool
	// Held: billing.ErrHeld is in the error's chain (a Busy error): the
	// order's claim, the event's own or another's, is blocked, and only an
	// operator settles it.
	Held bool
	// Paused: the error is billing.ErrPaused (a Busy error): an operator's
	// pause stopped the attempt before anything was sent. Only the
	// Decider reports it; the Handler waits for the resume itself before
	// every attempt (pipeline/pause.go), so a pause is never its failure.
	Paused bool
	// Outage: the Handler's outage detection declared this Transient
	// failure part of a dependency's outage (pipeline/outage.go).
	Outage bool
	// Attempts is how many of the event's failures counted against its
	// budget before this one (for the Decider, the deferred row's
	// attempts; Decide does not read it there).
	Attempts int
	// Spent is how long the event had failed, its counted failures only,
	// up to the previous counted one; SinceCounted is the time since that
	// one, zero when there was none or the event has waited since (an
	// outage, a busy order, a pause). A counted failure has spent
	// Spent+SinceCounted.
	Spent, SinceCounted time.Duration
	// Waited is how long the event has waited on another event's claim,
	// Busy answers in a row.
	Waited time.Duration
	// ParkFailed and DeferFailed: this failure was decided Park (Defer)
	// already, and the Handler could not park (defer) the event: its claim
	// was not pending any more, or the store failed. Decide then answers
	// what the event does instead.
	ParkFailed, DeferFailed bool
}

// Action is what the asker does with a failure.
type Action int8

const (
	// Retry (Handler): the failure counts against the event's budget; the
	// Handler backs off (transient backoff, no later than the moment the
	// event will have failed for ParkAfter) and calls the Biller again
	// with the same event: same Idempotency-Key, same body.
	Retry Action = iota
	// Wait (Handler): another event's claim is pending; the Handler backs
	// off (busy backoff) spending nothing, still ready, and tries again.
	Wait
	// Stall (Handler): a systemic failure or an outage; the Handler backs
	// off (systemic backoff) spending nothing, marks the service unready
	// until the event has another answer, and tries again.
	Stall
	// Park (Handler): the Handler hands the event's pending claim to the
	// completer with its record kept (pipeline.Parker). Parked, the record
	// is committed and the completer owns the claim; otherwise the Handler
	// asks again with ParkFailed set. Counts against the budget.
	Park
	// Defer (Handler): the Handler stores the event's record for a
	// decision once the claim settles (pipeline.Deferrer). Stored, the
	// record is committed and the Decider decides it later; otherwise the
	// Handler asks again with DeferFailed set. Spends nothing.
	Defer
	// DeadLetterInvalid, DeadLetterPermanent, DeadLetterConflict and
	// DeadLetterExhausted: the asker writes the record to the dead-letter
	// topic with the reason Reason returns, retrying until acknowledged.
	// Then the Handler commits the record; the Decider deletes the
	// deferred row (FinishDeferred). Only the Handler exhausts an event,
	// and only DeadLetterExhausted counts against its budget.
	DeadLetterInvalid
	DeadLetterPermanent
	DeadLetterConflict
	DeadLetterExhausted
	// GiveBack (Decider): the deferred row is given back (RetryDeferred),
	// to be decided again after its backoff; the pass goes on with the
	// next row.
	GiveBack
	// GiveBackAndStop (Decider): as GiveBack, and the pass ends with the
	// failure as its error (a systemic failure: the next pass tries again).
	GiveBackAndStop
	// GiveBackUnsent (Decider): an operator's pause stopped the attempt,
	// nothing sent: the row is given back due at once, and the pass ends
	// at its next pause check.
	GiveBackUnsent
	// Leave: the asker's context ended. The Handler returns its error,
	// the record uncommitted for redelivery; the Decider returns, and the
	// row is decided again once its lease ends.
	Leave
)

var actionNames = [...]string{
	Retry: "retry", Wait: "wait", Stall: "stall", Park: "park", Defer: "defer",
	DeadLetterInvalid: "dead-letter invalid", DeadLetterPermanent: "dead-letter permanent",
	DeadLetterConflict: "dead-letter conflict", DeadLetterExhausted: "dead-letter exhausted",
	GiveBack: "give back", GiveBackAndStop: "give back and stop", GiveBackUnsent: "give back unsent",
	Leave: "leave",
}

func (a Action) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// Reason is the dead-letter reason of a DeadLetter action, "" for any
// other.
func (a Action) Reason() dlq.Reason {
	switch a {
	case DeadLetterInvalid:
		return dlq.Invalid
	case DeadLetterPermanent:
		return dlq.Permanent
	case DeadLetterConflict:
		return dlq.Conflict
	case DeadLetterExhausted:
		return dlq.Exhausted
	}
	return ""
}

// Spends reports whether the Handler counts the failure against the
// event's budget (one attempt, SinceCounted more time spent) when it
// carries a out: Retry, Park and DeadLetterExhausted do. Every other
// action stops the budget's clock, except those that end the event
// (which leave it as it is). A Park that fails is decided again as an
// action that spends as well, and a failed Defer as one that does not.
func (a Action) Spends() bool {
	return a == Retry || a == Park || a == DeadLetterExhausted
}

// Decide returns what f's asker does with the failure under cfg. It is
// pure; the package doc tabulates it.
func Decide(cfg Config, f Failure) Action {
	if f.By == Decider {
		return decideDeferred(f)
	}
	if f.Canceled {
		return Leave
	}
	if a, ok := deadLetter(f.Kind); ok {
		return a
	}
	switch {
	case f.Kind == fault.Busy:
		if cfg.ParkAfter > 0 && !f.DeferFailed && (f.Held || f.Waited >= cfg.ParkAfter) {
			return Defer
		}
		return Wait
	case f.Kind == fault.Systemic, f.Kind == fault.Transient && f.Outage:
		return Stall
	}
	attempts, spent := f.Attempts+1, f.Spent+f.SinceCounted
	switch {
	case cfg.ParkAfter > 0 && spent >= cfg.ParkAfter && !f.ParkFailed:
		return Park
	case attempts >= cfg.MaxAttempts && spent >= cfg.RetryBudget:
		return DeadLetterExhausted
	}
	return Retry
}

// decideDeferred is Decide for the deciding loop: an event it cannot
// decide yet goes back to its row, never to the dead-letter topic.
func decideDeferred(f Failure) Action {
	if a, ok := deadLetter(f.Kind); ok {
		return a
	}
	switch {
	case f.Canceled:
		return Leave
	case f.Paused:
		return GiveBackUnsent
	case f.Kind == fault.Systemic:
		return GiveBackAndStop
	}
	return GiveBack
}

// deadLetter is the dead letter of the kinds that are the event's own
// definite fault.
func deadLetter(k fault.Kind) (Action, bool) {
	switch k {
	case fault.Invalid:
		return DeadLetterInvalid, true
	case fault.Permanent:
		return DeadLetterPermanent, true
	case fault.Conflict:
		return DeadLetterConflict, true
	}
	return 0, false
}
