package billing_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
)

// A valid event's record whose dlq-replay-count header is beyond
// Postgres' int (2147483648, say: any producer may write any header) is
// dead-lettered all the same: dlq.ReplayCount caps the count at
// math.MaxInt32, so the decision's replay_count (an int4) can hold it and
// the claim statement sees the same count. Before the cap, found by the
// second review of issue 29, pgx refused to encode the count,
// RecordDeadLetter failed and the pipeline retried the decision until its
// context ended: the record was neither billed nor dead-lettered and held
// its partition for good (SPEC §10). The test then reported "Handle:
// context deadline exceeded, dead letters []; want nil and [conflict]".
//
// Scenario: order 8811 is charged by its event; a record with the same
// event_id and another amount (a true conflict, dead-lettered `conflict`)
// arrives carrying dlq-replay-count 2147483648. The handler writes one
// `conflict` dead letter and returns. The count 7 is the control.
func TestAReplayCountBeyondInt4IsDeadLettered(t *testing.T) {
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
