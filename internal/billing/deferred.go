package billing

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/events"
)

// Deferred decisions (SPEC §10, §11): an event that waits on another
// event's unsettled claim on its order (Process answers fault.Busy) must
// not hold its partition either. After BILLING_PARK_AFTER of waiting the
// pipeline defers it — at once when the claim is blocked, its own or
// another event's (ErrHeld): only an operator's decision settles that —
// and a parked event keeps its record in a row waiting on its own claim
// (park.go). Defer stores its record, exactly as consumed, in
// deferred_event (migrations 00008 and 00009: its header keys as bytes), and the record is committed. Once the
// claim it waits on is settled (charged, released; a blocked claim by the
// operator), the deciding loop takes the row
// up (TakeDeferred), decides the event through Process exactly as a
// redelivery would be decided — Duplicate, DuplicateOrder, a Conflict to
// dead-letter from the stored bytes, or its own charge if the claim was
// released (a definite refusal of that charge then dead-letters it
// `permanent`) — and deletes the row (FinishDeferred) only after that
// decision is durable. A crash before the delete decides the event again:
// the ledger and processed_event make the second decision a Duplicate, so
// nothing is charged twice; a dead-letter record may be written twice (at
// least once, as every DLQ write is).

// Record is a Kafka record as consumed: what a deferred event's decision
// needs to dead-letter it with its original key, value and headers.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Time      time.Time
}

// Header is one record header. Key is the key's bytes as kafka-go hands
// them over, not necessarily UTF-8 (Kafka's own clients write Java strings,
// but any producer may write any bytes): Defer keeps them exactly, for the
// dead letter written from the stored record.
type Header struct {
	Key   string
	Value []byte
}

// headerColumns are r's headers as deferred_event's columns: header_keys
// (text[], see textKeys), header_key_bytes (the keys' exact bytes) and
// header_values.
func (r Record) headerColumns() (texts []string, keys, values [][]byte) {
	keys, values = make([][]byte, len(r.Headers)), make([][]byte, len(r.Headers))
	for i, h := range r.Headers {
		keys[i], values[i] = []byte(h.Key), h.Value
	}
	return textKeys(r.Headers), keys, values
}

// timeColumn is r's time as deferred_event's record_time: NULL when unset.
func (r Record) timeColumn() *time.Time {
	if r.Time.IsZero() {
		return nil
	}
	return &r.Time
}

// Deferred is a deferred event: a row of deferred_event.
type Deferred struct {
	// Seq is the row's place in the order of deferrals.
	Seq     int64
	EventID uuid.UUID
	OrderID int64
	// WaitsFor is the event whose claim held the order at deferral.
	WaitsFor uuid.UUID
	Record   Record
	// Age is the time since the deferral, by the database's clock.
	Age time.Duration
	// Attempts counts the times the row was taken up, this one included.
	Attempts int
}

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

// Defer stores ev's record rec for a later decision. It returns true when
// the record is stored (now or by an earlier delivery of the same bytes):
// the caller may commit it. False means neither another event's claim nor
// ev's own blocked claim holds ev's order any more: the caller processes
// ev again, which decides it now.
func (s *Service) Defer(ctx context.Context, ev events.OrderConfirmed, rec Record) (bool, error) {
	texts, keys, values := rec.headerColumns()
	dctx, cancel := s.live(ctx)
	defer cancel()
	rows, err := s.db.Query(dctx, deferSQL, s.group, [16]byte(ev.EventID), ev.OrderID, rec.Topic, rec.Partition, rec.Offset,
		rec.Key, rec.Value, texts, values, rec.timeColumn(), keys)
	var stored bool
	if err == nil {
		stored, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	}
	if err != nil {
		return false, classifyDB(fmt.Errorf("defer event %s of order %d: %w", ev.EventID, ev.OrderID, err))
	}
	return stored, nil
}

// TakeDeferred leases one deferred event that is due and whose order is
// held neither by an unsettled claim (another event's, or its own blocked
// or parked one) nor by an event deferred before it, or returns false: no other replica takes it for lease, which
// must outlast its decision. A row whose decision crashed is taken up
// again once its lease ends.
func (s *Service) TakeDeferred(ctx context.Context, lease time.Duration) (Deferred, bool, error) {
	qctx, cancel := s.live(ctx)
	defer cancel()
	rows, err := s.db.Query(qctx, takeDeferredSQL, s.group, lease.Milliseconds())
	if err != nil {
		return Deferred{}, false, classifyDB(fmt.Errorf("take a deferred event: %w", err))
	}
	out, err := pgx.CollectRows(rows, scanDeferred)
	if err != nil || len(out) == 0 {
		return Deferred{}, false, classifyDB(err)
	}
	return out[0], true, nil
}

// textKeys is what Defer writes to header_keys (text[]) beside the keys'
// bytes (header_key_bytes, migration 00009), for a binary of level 8 to
// read: the keys, when every one is text Postgres can hold (UTF-8 without
// a NUL byte), else none, which that binary refuses to decide (its keys
// and values differ in number) and leaves to this one.
func textKeys(hs []Header) []string {
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
func scanDeferred(row pgx.CollectableRow) (Deferred, error) {
	var d Deferred
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
		d.Record.Headers = append(d.Record.Headers, Header{Key: string(keys[i]), Value: values[i]})
	}
	if at != nil {
		d.Record.Time = *at
	}
	d.Age = time.Duration(age) * time.Microsecond
	return d, nil
}

// FinishDeferred deletes d's row: its decision is durable (the ledger and
// processed_event, or an acknowledged dead-letter record). A decider
// whose lease was taken over deletes nothing: the new holder decides the
// event again (to the same outcome) and finishes it.
func (s *Service) FinishDeferred(ctx context.Context, d Deferred) error {
	fctx, cancel := s.detached(ctx)
	defer cancel()
	if _, err := s.db.Exec(fctx, finishDeferredSQL, d.Seq, d.Attempts); err != nil {
		return classifyDB(fmt.Errorf("finish deferred event %s: %w", d.EventID, err))
	}
	return nil
}

// RetryDeferred gives d back, to be taken up again after the delay: its
// decision did not finish (its own charge's outcome is unknown, or the
// order is claimed again), cause says why.
func (s *Service) RetryDeferred(ctx context.Context, d Deferred, after time.Duration, cause error) error {
	rctx, cancel := s.detached(ctx)
	defer cancel()
	if _, err := s.db.Exec(rctx, retryDeferredSQL, d.Seq, d.Attempts, after.Milliseconds(), cause.Error()); err != nil {
		return classifyDB(fmt.Errorf("retry deferred event %s: %w", d.EventID, err))
	}
	return nil
}

// held reads, for evs[idx], the events deferred before them that hold
// their orders (heldSQL). Only an event whose claim found no row asks:
// rarely, and never on the common paths.
func (s *Service) held(ctx context.Context, evs []events.OrderConfirmed, idx []int) (map[uuid.UUID]uuid.UUID, error) {
	orders, ids := make([]int64, len(idx)), make([][16]byte, len(idx))
	for k, i := range idx {
		orders[k], ids[k] = evs[i].OrderID, evs[i].EventID
	}
	cctx, cancel := s.live(ctx)
	defer cancel()
	rows, err := s.db.Query(cctx, heldSQL, orders, ids, s.group)
	if err != nil {
		return nil, classifyDB(fmt.Errorf("read the deferred events holding %d orders: %w", len(idx), err))
	}
	out := map[uuid.UUID]uuid.UUID{}
	var e, by [16]byte
	_, err = pgx.ForEachRow(rows, []any{&e, &by}, func() error { out[e] = by; return nil })
	if err != nil {
		return nil, classifyDB(fmt.Errorf("read the deferred events holding %d orders: %w", len(idx), err))
	}
	return out, nil
}

// DeferredBehind is a deferred event as `claim show` lists it.
type DeferredBehind struct {
	Group    string
	EventID  uuid.UUID
	WaitsFor uuid.UUID
	// DeferredAt is the database's clock; Attempts counts the times the
	// deciding loop took the row up; LastError is its last word ("" for
	// none).
	DeferredAt time.Time
	Attempts   int
	LastError  string
}

// DeferredOn returns the events deferred on order, in every consumer
// group, in the order they will be decided. It changes nothing.
func DeferredOn(ctx context.Context, pool *pgxpool.Pool, order int64) ([]DeferredBehind, error) {
	rows, err := pool.Query(ctx, `SELECT consumer_group, event_id, waits_for, deferred_at, attempts, coalesce(last_error, '')
FROM deferred_event WHERE order_id = $1 ORDER BY consumer_group, seq`, order)
	if err != nil {
		return nil, fmt.Errorf("read the events deferred on order %d: %w", order, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeferredBehind, error) {
		var d DeferredBehind
		err := r.Scan(&d.Group, &d.EventID, &d.WaitsFor, &d.DeferredAt, &d.Attempts, &d.LastError)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the events deferred on order %d: %w", order, err)
	}
	return out, nil
}
