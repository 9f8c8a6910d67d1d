package billing

import (
	"context"
	"errors"
	"fmt"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// A valid event's dead letter is a decision (SPEC §11 I2): its dead
// letters all carry one reason. The decision is kept in dead_letter
// (migration 00012) beside processed_event: RecordDeadLetter stores it
// before the dead letter is written, with the record's dlq-replay-count
// (WithReplayCount); the claim statement (claimSQL) answers a later
// delivery of a record whose count is not higher with it — a
// *DeadLettered error: the caller writes the same dead letter again, and
// nothing is claimed or sent. Only a `dlq replay` (a higher count)
// decides the event afresh: its claim statement spends the old decision
// (ReplayedReason), so that a late redelivery of an older record is
// decided afresh too, never answered by a dead letter the replay may have
// since decided otherwise (duplicate_order, say). A decision never
// answers for an event whose own claim is charged: the money is the truth.

// DeadLettered is in the chain of Process's error for an event whose dead
// letter was decided before (by an earlier delivery of the same record, or
// of a record replayed no more often): Reason is that dead letter's
// dlq-reason (permanent, conflict or exhausted) and Cause its error text.
// The event was not claimed, nothing was sent: the caller writes the dead
// letter again, with Reason, and commits the record. Its fault.Kind is the
// reason's (Permanent, Conflict; Transient for exhausted), so that a
// caller that does not look for it at least never charges; test with
// errors.As.
type DeadLettered struct {
	Reason string
	Cause  string
}

func (e *DeadLettered) Error() string {
	return fmt.Sprintf("dead-lettered %s before (a dlq replay decides it again): %s", e.Reason, e.Cause)
}

// decidedBefore wraps a stored decision as Process answers it.
func decidedBefore(reason, cause string) error {
	kind := fault.Transient
	switch reason {
	case "permanent":
		kind = fault.Permanent
	case "conflict":
		kind = fault.Conflict
	}
	return fault.New(kind, &DeadLettered{Reason: reason, Cause: cause})
}

// AsDeadLettered returns the stored decision in err's chain, if any.
func AsDeadLettered(err error) (*DeadLettered, bool) {
	var d *DeadLettered
	ok := errors.As(err, &d)
	return d, ok
}

type replayKey struct{}

// WithReplayCount returns a context whose Process calls decide a record
// carrying dlq-replay-count n (0: never replayed). Apply it before
// WithAttempt: the attempt takes the count when it is made. A stored
// dead-letter decision answers a record whose count is not higher than the
// decision's.
func WithReplayCount(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, replayKey{}, n)
}

func replayCountOf(ctx context.Context) int {
	n, _ := ctx.Value(replayKey{}).(int)
	return n
}

// ReplayedReason is the reason of a dead_letter row that holds no
// decision: a record replayed replay_count times was claimed since the
// decision (claimSQL), so the spent dead letter answers no record of the
// event any more. Without it, a late redelivery of the original record
// after the replay was decided otherwise (duplicate_order, say) would be
// answered by the spent dead letter: two decisions (SPEC §11 I2). The
// event's next dead letter, from any of its records, takes the row at
// that count: a redelivery of the replayed record, decided after an
// older record was, is answered by it (one reason). Deleting the row
// instead would let the replay's redelivery decide afresh after a late
// original's dead letter, and write another reason.
const ReplayedReason = "replayed"

// RecordDeadLetter makes the dead letter of ev, decided for a record
// carrying dlq-replay-count replayCount with reason and cause, durable
// before it is written, and returns the reason and error to write it
// with: the stored ones when the event was dead-lettered before for a
// record replayed as often or more (one reason, SPEC §11 I2), else
// reason and cause. The caller retries an error (the database's, a
// Transient or Systemic fault.Kind) before it writes the dead letter: it
// must not write it without the decision. Safe for concurrent use.
func (s *Service) RecordDeadLetter(ctx context.Context, ev events.OrderConfirmed, replayCount int, reason, cause string) (string, string, error) {
	for range 2 {
		wctx, cancel := s.detached(ctx)
		stored, storedCause, ok, err := s.store.RecordDeadLetter(wctx, s.group, ev, replayCount, reason, cause)
		cancel()
		if err != nil {
			return "", "", err
		}
		if ok {
			return stored, storedCause, nil
		}
	}
	return "", "", fault.Errorf(fault.Transient, "record the dead letter of event %s: raced with another record of it twice", ev.EventID)
}
