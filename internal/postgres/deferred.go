package postgres

// pgStore's statements for deferred events, parked claims and dead
// letters.

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
)

// aheadSQL is the predicate "an event other than %[3]s was deferred on
// order %[2]s (group %[1]s) before %[3]s was" — before its first row, or at
// all when it has none: such an event is decided first, and nothing
// else may claim the order meanwhile. The claim statement (ledger.go)
// skips those orders; the lookup after it, Defer and TakeDeferred use it
// to wait.
const aheadSQL = `SELECT d.event_id FROM deferred_event d WHERE d.consumer_group = %[1]s AND d.order_id = %[2]s AND d.event_id <> %[3]s
AND d.seq < coalesce((SELECT min(m.seq) FROM deferred_event m WHERE m.consumer_group = %[1]s AND m.order_id = %[2]s AND m.event_id = %[3]s), 9223372036854775807)`

// ahead is aheadSQL over the given group, order and event expressions.
func ahead(group, order, event string) string { return fmt.Sprintf(aheadSQL, group, order, event) }

var (
	// deferSQL stores ev's record only while its order is held for
	// another event — that event's claim pending or blocked, or that
	// event deferred before — or by ev's own blocked claim (SPEC §11, I3:
	// ev is decided with the operator's decision; waits_for is then ev
	// itself). A record has one row at most, wherever it was read: while
	// the event has a row with the same bytes, nothing more is stored and
	// the answer is true (a redelivery of a deferred record, or a replay
	// of its dead letter at another offset: the row decides the event,
	// once). The same event in other bytes (a re-serialising producer)
	// gets a row of its own, after the first, decided as a duplicate; at a
	// place that holds other bytes it is not stored (false: the event
	// keeps waiting), never taken for stored.
	// The outer SELECT sees the rows as they were before the INSERT.
	deferSQL = `WITH ins AS (
  INSERT INTO deferred_event (consumer_group, event_id, order_id, waits_for, topic, kafka_partition, kafka_offset,
    record_key, record_value, header_keys, header_values, record_time, header_key_bytes)
  SELECT $1, $2, $3, w.event_id, $4, $5, $6, $7, $8, $9, $10, $11, $12 FROM (
    SELECT c.event_id FROM charge c WHERE c.order_id = $3
      AND (c.status IN ('pending', 'blocked') AND c.event_id <> $2 OR c.status = 'blocked' AND c.event_id = $2)
    UNION ALL (` + ahead("$1", "$3", "$2") + `)
    LIMIT 1) w
  WHERE NOT EXISTS (SELECT 1 FROM deferred_event e WHERE e.consumer_group = $1 AND e.event_id = $2 AND e.record_value = $8)
  ON CONFLICT (consumer_group, topic, kafka_partition, kafka_offset, event_id) DO NOTHING RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins) OR EXISTS (SELECT 1 FROM deferred_event WHERE consumer_group = $1 AND event_id = $2
  AND record_value = $8)`
	// takeDeferredSQL leases, for $2 milliseconds, one of the group's due
	// rows whose order is held neither by an unsettled claim — another
	// event's, pending or blocked; the row's own event's, blocked (that
	// waits for an operator) or parked (the completer owns it) — nor by a
	// row deferred before it; SKIP LOCKED keeps two replicas from taking
	// it. A row whose own claim is pending and not parked is taken: that
	// claim is the row's own earlier decision whose outcome stayed
	// unknown, and its decision re-sends it as a redelivery would.
	takeDeferredSQL = `UPDATE deferred_event d SET next_try_at = now() + $2 * interval '1 millisecond', attempts = d.attempts + 1
FROM (SELECT x.seq FROM deferred_event x
  WHERE x.consumer_group = $1 AND x.next_try_at <= now()
  AND NOT EXISTS (SELECT 1 FROM charge c WHERE c.order_id = x.order_id AND (c.status = 'blocked'
    OR c.status = 'pending' AND (c.event_id <> x.event_id OR c.parked_at IS NOT NULL)))
  AND NOT EXISTS (SELECT 1 FROM deferred_event e WHERE e.consumer_group = x.consumer_group AND e.order_id = x.order_id AND e.seq < x.seq)
  ORDER BY x.next_try_at LIMIT 1 FOR UPDATE OF x SKIP LOCKED) t
WHERE d.seq = t.seq
RETURNING d.seq, d.event_id, d.order_id, d.waits_for, d.topic, d.kafka_partition, d.kafka_offset, d.record_key, d.record_value,
  d.header_keys, d.header_values, d.record_time, (extract(epoch FROM now() - d.deferred_at) * 1000000)::bigint, d.attempts,
  d.header_key_bytes`
)

// heldSQL returns, for each order and event given, the event deferred
// before it that holds the order, if any.
var heldSQL = `SELECT v.e, h.event_id FROM unnest($1::bigint[], $2::uuid[]) AS v(o, e)
CROSS JOIN LATERAL (` + ahead("$3", "v.o", "v.e") + ` ORDER BY d.seq LIMIT 1) h`

// finishDeferredSQL and retryDeferredSQL change a row only for the holder
// of its latest lease (its attempts): a decider whose lease ran out
// leaves the row to the one that took it over.
const (
	finishDeferredSQL = `DELETE FROM deferred_event WHERE seq = $1 AND attempts = $2`
	retryDeferredSQL  = `UPDATE deferred_event SET next_try_at = now() + $3 * interval '1 millisecond', last_error = $4
WHERE seq = $1 AND attempts = $2`
)

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

// recordDeadLetterSQL stores a decision, or keeps the stored one unless
// the incoming record was replayed more often or the row holds no
// decision (billing.ReplayedReason), and returns the reason and error to
// dead-letter with ($1 event, $2 group, $3 reason, $4 replay count, $5
// error, $6 order, $7 customer, $8 amount: a decision is the event's with
// these parameters; a record reusing the event_id with others has its
// own). A decision stored over billing.ReplayedReason keeps the higher count.
// The outer SELECT sees the row as it was before the statement: the
// stored decision when the upsert changed nothing. A row inserted or
// changed meanwhile by a concurrent transaction may be seen by neither
// part (or, a billing.ReplayedReason the upsert no longer found, by the outer
// SELECT, which skips it): no row, and the caller asks again.
const recordDeadLetterSQL = `WITH up AS (
  INSERT INTO dead_letter AS d (event_id, consumer_group, reason, replay_count, error, order_id, customer_id, amount)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8::numeric)
  ON CONFLICT (event_id, consumer_group, order_id, customer_id, amount) DO UPDATE
  SET reason = excluded.reason, replay_count = greatest(d.replay_count, excluded.replay_count), error = excluded.error, decided_at = now()
  WHERE d.replay_count < excluded.replay_count OR d.reason = '` + billing.ReplayedReason + `'
  RETURNING reason, error)
SELECT reason, error FROM up
UNION ALL
SELECT reason, error FROM dead_letter WHERE event_id = $1 AND consumer_group = $2
  AND order_id = $6 AND customer_id = $7 AND amount = $8::numeric AND reason <> '` + billing.ReplayedReason + `'
  AND NOT EXISTS (SELECT 1 FROM up)`

// headerColumns are r's headers as deferred_event's columns: header_keys
// (text[], see textKeys), header_key_bytes (the keys' exact bytes) and
// header_values.
func headerColumns(r billing.Record) (texts []string, keys, values [][]byte) {
	keys, values = make([][]byte, len(r.Headers)), make([][]byte, len(r.Headers))
	for i, h := range r.Headers {
		keys[i], values[i] = []byte(h.Key), h.Value
	}
	return textKeys(r.Headers), keys, values
}

// timeColumn is r's time as deferred_event's record_time: NULL when unset.
func timeColumn(r billing.Record) *time.Time {
	if r.Time.IsZero() {
		return nil
	}
	return &r.Time
}

// textKeys is what Defer writes to header_keys (text[]) beside the keys'
// bytes (header_key_bytes, migration 00009), for a binary of level 8 to
// read: the keys, when every one is text Postgres can hold (UTF-8 without
// a NUL byte), else none, which that binary refuses to decide (its keys
// and values differ in number) and leaves to this one.
func textKeys(hs []billing.Header) []string {
	keys := make([]string, 0, len(hs))
	for _, h := range hs {
		if !utf8.ValidString(h.Key) || strings.IndexByte(h.Key, 0) >= 0 {
			return []string{}
		}
		keys = append(keys, h.Key)
	}
	return keys
}

// scanDeferred reads a row of takeDeferredSQL. The header keys are
// header_key_bytes; a row written by a binary of level 8 (or before
// migration 00009) has none, and its text keys are its keys.
func scanDeferred(row pgx.CollectableRow) (billing.Deferred, error) {
	var d billing.Deferred
	var texts []string
	var keys, values [][]byte
	var at *time.Time
	var age int64
	err := row.Scan(&d.Seq, (*[16]byte)(&d.EventID), &d.OrderID, (*[16]byte)(&d.WaitsFor), &d.Record.Topic, &d.Record.Partition,
		&d.Record.Offset, &d.Record.Key, &d.Record.Value, &texts, &values, &at, &age, &d.Attempts, &keys)
	if err != nil {
		return d, err
	}
	if keys == nil {
		for _, k := range texts {
			keys = append(keys, []byte(k))
		}
	}
	if len(keys) != len(values) {
		return d, fmt.Errorf("deferred event %s: %d header keys, %d values", d.EventID, len(keys), len(values))
	}
	for i := range keys {
		d.Record.Headers = append(d.Record.Headers, billing.Header{Key: string(keys[i]), Value: values[i]})
	}
	if at != nil {
		d.Record.Time = *at
	}
	d.Age = time.Duration(age) * time.Microsecond
	return d, nil
}

// Defer runs deferSQL.
func (s *Store) Defer(ctx context.Context, group string, ev events.OrderConfirmed, rec billing.Record) (bool, error) {
	texts, keys, values := headerColumns(rec)
	rows, err := s.db.Query(ctx, deferSQL, group, [16]byte(ev.EventID), ev.OrderID, rec.Topic, rec.Partition, rec.Offset,
		rec.Key, rec.Value, texts, values, timeColumn(rec), keys)
	var stored bool
	if err == nil {
		stored, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	}
	if err != nil {
		return false, classifyDB(fmt.Errorf("defer event %s of order %d: %w", ev.EventID, ev.OrderID, err))
	}
	return stored, nil
}

// TakeDeferred runs takeDeferredSQL.
func (s *Store) TakeDeferred(ctx context.Context, group string, lease time.Duration) (billing.Deferred, bool, error) {
	rows, err := s.db.Query(ctx, takeDeferredSQL, group, lease.Milliseconds())
	if err != nil {
		return billing.Deferred{}, false, classifyDB(fmt.Errorf("take a deferred event: %w", err))
	}
	out, err := pgx.CollectRows(rows, scanDeferred)
	if err != nil || len(out) == 0 {
		return billing.Deferred{}, false, classifyDB(err)
	}
	return out[0], true, nil
}

// FinishDeferred runs finishDeferredSQL.
func (s *Store) FinishDeferred(ctx context.Context, d billing.Deferred) error {
	if _, err := s.db.Exec(ctx, finishDeferredSQL, d.Seq, d.Attempts); err != nil {
		return classifyDB(fmt.Errorf("finish deferred event %s: %w", d.EventID, err))
	}
	return nil
}

// RetryDeferred runs retryDeferredSQL.
func (s *Store) RetryDeferred(ctx context.Context, d billing.Deferred, after time.Duration, cause string) error {
	if _, err := s.db.Exec(ctx, retryDeferredSQL, d.Seq, d.Attempts, after.Milliseconds(), cause); err != nil {
		return classifyDB(fmt.Errorf("retry deferred event %s: %w", d.EventID, err))
	}
	return nil
}

// HeldBy runs heldSQL.
func (s *Store) HeldBy(ctx context.Context, group string, orders []int64, ids []uuid.UUID) (map[uuid.UUID]uuid.UUID, error) {
	rows, err := s.db.Query(ctx, heldSQL, orders, dedup.Binary(ids), group)
	if err != nil {
		return nil, classifyDB(fmt.Errorf("read the deferred events holding %d orders: %w", len(orders), err))
	}
	out := map[uuid.UUID]uuid.UUID{}
	var e, by [16]byte
	_, err = pgx.ForEachRow(rows, []any{&e, &by}, func() error { out[e] = by; return nil })
	if err != nil {
		return nil, classifyDB(fmt.Errorf("read the deferred events holding %d orders: %w", len(orders), err))
	}
	return out, nil
}

// Park runs parkSQL.
func (s *Store) Park(ctx context.Context, group string, ev events.OrderConfirmed, rec billing.Record, firstSend time.Duration) (bool, error) {
	texts, keys, values := headerColumns(rec)
	rows, err := s.db.Query(ctx, parkSQL, ev.OrderID, [16]byte(ev.EventID), ev.CustomerID, ev.TotalAmount.String(), firstSend.Milliseconds(),
		group, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value, texts, values, timeColumn(rec), keys)
	var parked int64
	if err == nil {
		parked, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	}
	if err != nil {
		return false, classifyDB(fmt.Errorf("park the claim of order %d: %w", ev.OrderID, err))
	}
	return parked == 1, nil
}

// RecordDeadLetter runs recordDeadLetterSQL.
func (s *Store) RecordDeadLetter(ctx context.Context, group string, ev events.OrderConfirmed, replayCount int, reason, cause string) (string, string, bool, error) {
	rows, err := s.db.Query(ctx, recordDeadLetterSQL, [16]byte(ev.EventID), group, reason, replayCount, cause,
		ev.OrderID, ev.CustomerID, ev.TotalAmount.String())
	var got [][2]string
	if err == nil {
		got, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
			var v [2]string
			return v, r.Scan(&v[0], &v[1])
		})
	}
	if err != nil {
		return "", "", false, classifyDB(fmt.Errorf("record the dead letter of event %s: %w", ev.EventID, err))
	}
	if len(got) != 1 {
		return "", "", false, nil
	}
	return got[0][0], got[0][1], true, nil
}
