package billing

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

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

// parkSQL parks a pending claim of the event given, with its body. The
// parking attempt need not be the claim's creator, and from now on the
// completer sends the claim's request: so it also records others_sent_at,
// and no creator still running elsewhere (the old owner of a rebalanced
// partition) can release a parked claim. The times are the database's.
//
// It stores the record ($6 the consumer group, $7... the record as
// deferSQL takes it) only with the park, so that a committed parked record
// always has its row; a record parked before (a redelivery parked again)
// keeps its row, and so does an event whose record has a row already,
// wherever it was read (one row a record, as deferSQL keeps). It answers the number of claims parked, 0
// or 1.
const parkSQL = `WITH p AS (
  UPDATE charge SET parked_at = coalesce(parked_at, now()), next_send_at = now() + $5 * interval '1 millisecond',
  others_sent_at = coalesce(others_sent_at, now())
  WHERE order_id = $1 AND event_id = $2 AND customer_id = $3 AND amount = $4::numeric AND status = 'pending' RETURNING event_id),
ins AS (
  INSERT INTO deferred_event (consumer_group, event_id, order_id, waits_for, topic, kafka_partition, kafka_offset,
    record_key, record_value, header_keys, header_values, record_time, header_key_bytes)
  SELECT $6, p.event_id, $1, p.event_id, $7, $8, $9, $10, $11, $12, $13, $14, $15 FROM p
  WHERE NOT EXISTS (SELECT 1 FROM deferred_event e WHERE e.consumer_group = $6 AND e.event_id = p.event_id AND e.record_value = $11)
  ON CONFLICT (consumer_group, topic, kafka_partition, kafka_offset, event_id) DO NOTHING)
SELECT count(*) FROM p`

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
	texts, keys, values := rec.headerColumns()
	pctx, cancel := s.live(ctx)
	defer cancel()
	rows, err := s.db.Query(pctx, parkSQL, ev.OrderID, [16]byte(ev.EventID), ev.CustomerID, ev.TotalAmount.String(), firstParkedSend.Milliseconds(),
		s.group, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value, texts, values, rec.timeColumn(), keys)
	var parked int64
	if err == nil {
		parked, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	}
	if err != nil {
		return false, classifyDB(fmt.Errorf("park the claim of order %d: %w", ev.OrderID, err))
	}
	return parked == 1, nil
}

// The completer's statements for parked claims.
const (
	// parkedDueSQL selects the parked claims whose next re-send is due.
	parkedDueSQL = `SELECT ` + claimColumns + ` FROM charge
WHERE status = 'pending' AND parked_at IS NOT NULL AND next_send_at <= now() ORDER BY next_send_at LIMIT $1`
	// stillUnknownSQL records a re-send whose outcome stayed unknown; a
	// parked claim's next re-send backs off exponentially from a second,
	// capped at $4 milliseconds.
	stillUnknownSQL = `UPDATE charge SET settle_attempts = settle_attempts + 1, last_error = $3,
next_send_at = CASE WHEN parked_at IS NULL THEN NULL
  ELSE now() + least(interval '1 second' * power(2, least(settle_attempts, 16)), $4 * interval '1 millisecond') END
WHERE order_id = $1 AND event_id = $2 AND status = 'pending'`
)

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
