package billing_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// oddHeaders are record headers whose keys Postgres text cannot hold (not
// UTF-8, a NUL byte) beside ordinary ones and an empty key: kafka-go hands
// a header key over as a Go string of any bytes, and a dead letter written
// from a deferred record must carry those bytes back.
func oddHeaders() []billing.Header {
	return []billing.Header{
		{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
		{Key: "\xff\xfekey", Value: []byte("from a Latin-1 producer")},
		{Key: "nul\x00key", Value: []byte{0, 1, 2}},
		{Key: "", Value: []byte("empty key")},
	}
}

// sameHeaders reports whether got holds exactly want's keys and values, in
// order.
func sameHeaders(got []kafka.Header, want []billing.Header) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range want {
		if got[i].Key != want[i].Key || !bytes.Equal(got[i].Value, want[i].Value) {
			return false
		}
	}
	return true
}

// headersOf is a record's headers as kafka-go's.
func headersOf(hs []billing.Header) []kafka.Header {
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// deferOdd leaves a's claim pending and b deferred behind it with rec,
// whose headers are oddHeaders.
func (e *env) deferOdd(t *testing.T, a, b events.OrderConfirmed) billing.Record {
	t.Helper()
	e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
	rec := recordOf(b)
	rec.Headers = oddHeaders()
	if ok, err := e.svc.Defer(context.Background(), b, rec); err != nil || !ok {
		t.Fatalf("Defer of a record with header keys that are not text = %v, %v; want true", ok, err)
	}
	return rec
}

// A record whose header keys are not text (not UTF-8, a NUL byte) is
// deferred like any other, and TakeDeferred hands its header keys back as
// the exact bytes consumed.
func TestDeferKeepsHeaderKeyBytes(t *testing.T) {
	e := newEnv(t, "secret-token")
	a, b := pair(9900, byCharge)
	rec := e.deferOdd(t, a, b)
	e.completePass(t, 2*time.Minute)
	d, ok, err := e.svc.TakeDeferred(context.Background(), time.Minute)
	if err != nil || !ok || d.EventID != b.EventID {
		t.Fatalf("take after the claim settled = %+v, %v, %v; want the event", d, ok, err)
	}
	if !sameHeaders(headersOf(d.Record.Headers), rec.Headers) {
		t.Fatalf("taken headers %q; want %q", d.Record.Headers, rec.Headers)
	}
}

// The dead letter of a deferred event (a conflict) is written from its
// stored record with the original header key bytes.
func TestDeadLetterOfADeferredRecordKeepsHeaderKeyBytes(t *testing.T) {
	e := newEnv(t, "secret-token")
	a, b := pair(9901, byConflict)
	rec := e.deferOdd(t, a, b)
	e.completePass(t, 2*time.Minute)
	dl := &dlqRecorder{}
	e.decideAll(t, deciderOf(t, e.svc, dl))
	e.assertChargedOnce(t, a)
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if len(dl.sent) == 0 {
		t.Fatal("the conflicting deferred event was not dead-lettered")
	}
	for i, m := range dl.sent {
		if dl.why[i] != dlq.Conflict || !bytes.Equal(m.Value, rec.Value) || !sameHeaders(m.Headers, rec.Headers) {
			t.Fatalf("dead-letter record %d: %s, headers %q; want a conflict with the original headers %q", i, dl.why[i], m.Headers, rec.Headers)
		}
	}
}

// level8Headers reads a deferred row's header columns as a binary of level
// 8 (before migration 00009) reads them: header_keys and header_values,
// which its scanDeferred refuses to decide unless they are as many.
func (e *env) level8Headers(t *testing.T, ev events.OrderConfirmed) (keys []string, values [][]byte) {
	t.Helper()
	err := e.pool.QueryRow(context.Background(), "SELECT header_keys, header_values FROM deferred_event WHERE event_id = $1",
		[16]byte(ev.EventID)).Scan(&keys, &values)
	if err != nil {
		t.Fatal(err)
	}
	return keys, values
}

// level8InsertSQL is the row a binary of level 8 writes (its deferSQL's
// columns): no header_key_bytes.
const level8InsertSQL = `INSERT INTO deferred_event (consumer_group, event_id, order_id, waits_for, topic, kafka_partition, kafka_offset,
  record_key, record_value, header_keys, header_values, record_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`

// Across a rolling upgrade from level 8 (migration 00009): a row a level-8
// binary wrote (text keys only) is read by this one with its headers; a row
// this binary writes with text keys keeps them in header_keys, so a level-8
// binary decides it too; a row with keys that are not text has none there,
// so a level-8 binary refuses to decide it (its keys and values differ in
// number) and leaves it, intact, to this one. The table still refuses keys
// and values that differ in number.
func TestDeferredRowsAcrossTheHeaderBytesUpgrade(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()

	old := event(9910, 1500)
	oldRec := recordOf(old)
	if _, err := e.pool.Exec(ctx, level8InsertSQL, group, [16]byte(old.EventID), old.OrderID, [16]byte(old.EventID), oldRec.Topic,
		oldRec.Partition, oldRec.Offset, oldRec.Key, oldRec.Value, []string{"traceparent", "x-empty"},
		[][]byte{oldRec.Headers[0].Value, {}}, oldRec.Time); err != nil {
		t.Fatalf("a row as level 8 writes it: %v", err)
	}
	d, ok, err := e.svc.TakeDeferred(ctx, time.Minute)
	want := []billing.Header{oldRec.Headers[0], {Key: "x-empty", Value: []byte{}}}
	if err != nil || !ok || d.EventID != old.EventID || !sameHeaders(headersOf(d.Record.Headers), want) {
		t.Fatalf("take of a level-8 row = %+v, %v, %v; want its headers %q", d, ok, err, want)
	}

	a, text := pair(9911, byCharge)
	e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
	if ok, err := e.svc.Defer(ctx, text, recordOf(text)); err != nil || !ok {
		t.Fatalf("Defer = %v, %v; want true", ok, err)
	}
	if keys, values := e.level8Headers(t, text); len(keys) != 1 || keys[0] != "traceparent" || len(values) != 1 {
		t.Fatalf("a text-keyed row as level 8 reads it: keys %q, %d values; want traceparent and its value", keys, len(values))
	}
	c, odd := pair(9912, byCharge)
	e.deferOdd(t, c, odd)
	if keys, values := e.level8Headers(t, odd); len(keys) == len(values) {
		t.Fatalf("a row with keys that are not text, as level 8 reads it: keys %q, %d values; want them to differ in number", keys, len(values))
	}

	for name, args := range map[string][]any{
		"level 8, one key too many": {[]string{"a", "b"}, [][]byte{{1}}, nil},
		"bytes, one key too few":    {[]string{}, [][]byte{{1}, {2}}, [][]byte{[]byte("\xff")}},
		"bytes and text disagree":   {[]string{"a"}, [][]byte{{1}, {2}}, [][]byte{{3}, {4}}},
	} {
		_, err := e.pool.Exec(ctx, `INSERT INTO deferred_event (consumer_group, event_id, order_id, waits_for, topic, kafka_partition,
  kafka_offset, record_value, header_keys, header_values, header_key_bytes) VALUES ($1, $2, 1, $2, 't', 0, 0, '{}', $3, $4, $5)`,
			group, [16]byte(events.IDAt(now)), args[0], args[1], args[2])
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Errorf("%s: %v; want a check violation", name, err)
		}
	}
}
