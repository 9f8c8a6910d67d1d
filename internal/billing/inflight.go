package billing

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// The operator's guard against a request in flight (SPEC §11 I5): `claim
// release` and `claim mark-charged` refuse while the provider may still
// take the claim's money — until the claim's decide_after (its latest
// recorded send's deadline plus the provider's bound, sends.go), and while
// a replica of a binary that does not record its creator's sends still
// heartbeats. Every bound is read from the database, none from the
// operator's environment.

// SendsRecordedFrom is the binary level (migration 00010) from which every
// send of a claim, the creator's included, is recorded. A replica of a
// lower level sends without a trace, so no operator decision is safe
// while one runs.
const SendsRecordedFrom = 10

// InFlightError is ApplyOperator's refusal of a move while a request for
// the claim may still be in flight, or finished by the provider, or while
// a replica that does not record its sends runs. It wraps ErrUnsafe.
type InFlightError struct {
	// AllowedAt is when the move becomes allowed by the database's clock,
	// unless another send is recorded meanwhile (or the old replicas keep
	// running); Wait is how long that is from the refusal.
	AllowedAt time.Time
	Wait      time.Duration
	// Why says what is in flight.
	Why string
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("%v: %s; allowed from %s (in %s)",
		ErrUnsafe, e.Why, e.AllowedAt.UTC().Format(time.RFC3339), e.Wait.Round(time.Second))
}

func (e *InFlightError) Unwrap() error { return ErrUnsafe }

// UnrecordedProviderBound is the provider bound the operator's guard
// assumes for a request that an old replica sent without a record, when
// the claim has none recorded either (a claim made before migration
// 00010): BILLING_PROVIDER_MAX_PROCESSING's default. A claim whose sends
// were recorded carries its senders' own bound (decide_after -
// in_flight_until), and that one is used.
const UnrecordedProviderBound = 5 * time.Minute

// OldReplicas is what OperatorTx.OldReplicas reads, by the database's
// clock: Now, and the replicas of a binary below the level asked that may
// still have a request at the provider — those whose heartbeat is fresher
// than the stale window (after which a SIGKILLed replica no longer runs)
// plus the bound asked (the provider's bound on their last request): how
// many, when the last of them is past that (Until, zero for none), and
// who they are.
type OldReplicas struct {
	Now   time.Time
	Count int
	Until time.Time
	Who   string
}

// InFlightFacts are what says whether a request for a claim may still be
// in flight or be finished by the provider (SPEC §11 I5), all by the
// database's clock: read by readInFlight with the claim locked, decided
// by refusal (in the claim's transition function, operatorNext). The
// zero value refuses nothing.
type InFlightFacts struct {
	Now time.Time
	// InFlightUntil is the claim's latest recorded send's deadline,
	// DecideAfter that plus the provider's bound (zero for none recorded).
	InFlightUntil, DecideAfter time.Time
	// OldReplicas counts the replicas of a level below SendsRecordedFrom
	// that heartbeat within the stale window plus Bound (the provider's
	// bound on their last unrecorded request); OldUntil is when the last
	// of them is past that, OldWho who they are.
	OldReplicas int
	OldUntil    time.Time
	OldWho      string
	Bound       time.Duration
}

// readInFlight reads the facts of cl, read FOR UPDATE in tx (so that no
// send is recorded meanwhile).
func readInFlight(ctx context.Context, tx OperatorTx, cl OperatorClaim) (InFlightFacts, error) {
	f := InFlightFacts{InFlightUntil: cl.InFlightUntil, DecideAfter: cl.DecideAfter, Bound: UnrecordedProviderBound}
	if !cl.DecideAfter.IsZero() && !cl.InFlightUntil.IsZero() {
		f.Bound = cl.DecideAfter.Sub(cl.InFlightUntil)
	}
	old, err := tx.OldReplicas(ctx, SendsRecordedFrom, f.Bound)
	if err != nil {
		return f, fmt.Errorf("read billing_replica: %w", err)
	}
	f.Now, f.OldReplicas, f.OldUntil, f.OldWho = old.Now, old.Count, old.Until, old.Who
	return f, nil
}

// refusal is the I5 rule: an *InFlightError while an old replica may
// still have a request at the provider, or before the claim's
// decide_after; nil when a decision is safe now.
func (f InFlightFacts) refusal() *InFlightError {
	if f.OldReplicas > 0 {
		return &InFlightError{AllowedAt: f.OldUntil, Wait: f.OldUntil.Sub(f.Now), Why: fmt.Sprintf(
			"%d replica(s) of a binary below level %d ran within the provider's bound (%s) of their last heartbeat (%s): they send without recording it, so a request for this claim may still be in flight or be finished by the provider; finish the upgrade, then wait until the time below",
			f.OldReplicas, SendsRecordedFrom, f.Bound, f.OldWho)}
	}
	if f.DecideAfter.After(f.Now) {
		return &InFlightError{AllowedAt: f.DecideAfter, Wait: f.DecideAfter.Sub(f.Now), Why: fmt.Sprintf(
			"a request for this claim may still be in flight (the latest recorded send's deadline is %s) or still be finished by the provider (BILLING_PROVIDER_MAX_PROCESSING after it); later if another send is recorded meanwhile",
			f.InFlightUntil.UTC().Format(time.RFC3339))}
	}
	return nil
}

// Send is one recorded send of a claim's request.
type Send struct {
	// Sender is SenderCreator, SenderRedelivery, SenderCompleter or
	// SenderReconcile; FirstSend marks the creator's first send, which the
	// claim itself records (its InFlightUntil is zero when later sends
	// have moved the claim's deadline on: only the latest is kept).
	Sender    string
	FirstSend bool
	// EventID is the event whose request was sent (its idempotency key):
	// after a release, the sends of the order's earlier claims stay.
	EventID uuid.UUID
	Host    string
	SentAt  time.Time
	// InFlightUntil is the send's deadline: nothing was sent after it.
	InFlightUntil time.Time
}

// ClaimSends returns the recorded sends of order's claims, oldest first:
// the creator's first send of cl (the claim as ShowClaim read it; nil
// when the order has none), then every other recorded send, also those
// of claims since released. It changes nothing.
func ClaimSends(ctx context.Context, db OperatorStore, order int64, cl *OperatorClaim) ([]Send, error) {
	later, err := db.RecordedSends(ctx, order)
	if err != nil {
		return nil, fmt.Errorf("read the sends of order %d: %w", order, err)
	}
	if cl == nil || cl.ClaimedBy == "" {
		return later, nil
	}
	first := Send{Sender: SenderCreator, FirstSend: true, EventID: cl.EventID, Host: cl.ClaimedBy, SentAt: cl.ClaimedAt}
	if !hasLaterSend(later, cl) {
		first.InFlightUntil = cl.InFlightUntil
	}
	return append([]Send{first}, later...), nil
}

// hasLaterSend reports whether one of sends is a later send of cl's
// request: then cl's in_flight_until is that send's, not the first's.
func hasLaterSend(sends []Send, cl *OperatorClaim) bool {
	for _, s := range sends {
		if s.EventID == cl.EventID && !s.SentAt.Before(cl.ClaimedAt) {
			return true
		}
	}
	return false
}

// SenderLabel is how `claim show` names a send's sender.
func (s Send) SenderLabel() string {
	if s.FirstSend {
		return s.Sender + " (first send, recorded by the claim)"
	}
	return strings.TrimSpace(s.Sender)
}
