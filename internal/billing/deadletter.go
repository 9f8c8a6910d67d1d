package billing

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
// (replayedReason), so that a late redelivery of an older record is
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

// claimAnswer is one row claimSQL returns: an event it claimed, or one
// its stored dead-letter decision answers (decided, with reason and cause).
type claimAnswer struct {
	event         uuid.UUID
	decided       bool
	reason, cause string
}

func scanClaimAnswer(row pgx.CollectableRow) (claimAnswer, error) {
	var a claimAnswer
	var reason, cause pgtype.Text
	if err := row.Scan((*[16]byte)(&a.event), &reason, &cause); err != nil {
		return claimAnswer{}, err
	}
	a.decided, a.reason, a.cause = reason.Valid, reason.String, cause.String
	return a, nil
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

// replayedReason is the reason of a dead_letter row that holds no
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
const replayedReason = "replayed"

// recordDeadLetterSQL stores a decision, or keeps the stored one unless
// the incoming record was replayed more often or the row holds no
// decision (replayedReason), and returns the reason and error to
// dead-letter with ($1 event, $2 group, $3 reason, $4 replay count, $5
// error, $6 order, $7 customer, $8 amount: a decision is the event's with
// these parameters; a record reusing the event_id with others has its
// own). A decision stored over replayedReason keeps the higher count.
// The outer SELECT sees the row as it was before the statement: the
// stored decision when the upsert changed nothing. A row inserted or
// changed meanwhile by a concurrent transaction may be seen by neither
// part (or, a replayedReason the upsert no longer found, by the outer
// SELECT, which skips it): no row, and the caller asks again.
const recordDeadLetterSQL = `WITH up AS (
  INSERT INTO dead_letter AS d (event_id, consumer_group, reason, replay_count, error, order_id, customer_id, amount)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8::numeric)
  ON CONFLICT (event_id, consumer_group, order_id, customer_id, amount) DO UPDATE
  SET reason = excluded.reason, replay_count = greatest(d.replay_count, excluded.replay_count), error = excluded.error, decided_at = now()
  WHERE d.replay_count < excluded.replay_count OR d.reason = '` + replayedReason + `'
  RETURNING reason, error)
SELECT reason, error FROM up
UNION ALL
SELECT reason, error FROM dead_letter WHERE event_id = $1 AND consumer_group = $2
  AND order_id = $6 AND customer_id = $7 AND amount = $8::numeric AND reason <> '` + replayedReason + `'
  AND NOT EXISTS (SELECT 1 FROM up)`

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
		rows, err := s.db.Query(wctx, recordDeadLetterSQL, [16]byte(ev.EventID), s.group, reason, replayCount, cause,
			ev.OrderID, ev.CustomerID, ev.TotalAmount.String())
		var got [][2]string
		if err == nil {
			got, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
				var v [2]string
				return v, r.Scan(&v[0], &v[1])
			})
		}
		cancel()
		if err != nil {
			return "", "", classifyDB(fmt.Errorf("record the dead letter of event %s: %w", ev.EventID, err))
		}
		if len(got) == 1 {
			return got[0][0], got[0][1], nil
		}
	}
	return "", "", fault.Errorf(fault.Transient, "record the dead letter of event %s: raced with another record of it twice", ev.EventID)
}
