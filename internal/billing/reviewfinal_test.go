package billing_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
)

// A FAILING review test (issue 29 item 7, second review of the final
// code): a valid event's record whose dlq-replay-count header is beyond
// Postgres' int (2147483648, say: any producer may write any header, and
// dlq.ReplayCount accepts every positive Go int) is never dead-lettered.
// Its dead letter must first be recorded as a decision (writeDLQ ->
// decision -> RecordDeadLetter), whose replay_count parameter is an int4:
// pgx refuses to encode the value, RecordDeadLetter fails, and the
// pipeline retries the decision until its context ends. The record is
// neither billed nor dead-lettered, and its partition is held behind it
// for good (SPEC §10; a poison record the DLQ exists for). The claim
// statement (claimOnce) meanwhile truncates the same count to int32, so
// the two statements do not even agree on the record's count
// (4294967297 is a replay count of 1 to claimSQL).
//
// Scenario: order 8811 is charged by its event; a record with the same
// event_id and another amount (a true conflict, dead-lettered `conflict`)
// arrives carrying dlq-replay-count 2147483648. The handler should write
// one `conflict` dead letter and return; it returns the context's error
// with nothing written. The count 7 is the control: the same record is
// dead-lettered at once.
func TestReviewReplayCountBeyondInt4IsDeadLettered(t *testing.T) {
	for _, count := range []string{"7", "2147483648"} {
		t.Run(count, func(t *testing.T) { replayCountDeadLettered(t, count) })
	}
}

func replayCountDeadLettered(t *testing.T, count string) {
	e := newEnv(t, "secret-token")
	dl := &dlqRecorder{}
	h := newDecidingHandler(t, e.svc, dl)
	ev := event(8811, 1000)
	if _, err := e.svc.Process(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	forged := ev
	forged.TotalAmount = 2000
	msg := kafkaRecord(forged, 0)
	msg.Headers = append(msg.Headers, kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte(count)})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := h.Handle(ctx, msg)
	dl.mu.Lock()
	why := slices.Clone(dl.why)
	dl.mu.Unlock()
	if err != nil || !slices.Equal(why, []dlq.Reason{dlq.Conflict}) {
		t.Fatalf("Handle: %v, dead letters %v; want nil and [conflict] (the record must not hold its partition)", err, why)
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM dead_letter WHERE event_id = $1`, ev.EventID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d dead_letter rows for the event; want its decision", n)
	}
}
