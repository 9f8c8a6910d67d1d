package pipeline

import (
	"context"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// A valid event's dead letter keeps the reason decided first (SPEC §11
// I2): the biller's answer from a stored decision (billing.DeadLettered)
// is written again at once, nothing retried; a record decided afresh
// whose decision differs from the stored one is written with the stored
// reason; a replayed record (a higher dlq-replay-count) is stored and
// written with its own.
func TestADeadLetterKeepsTheReasonDecidedFirst(t *testing.T) {
	for _, tc := range []struct {
		name      string
		replays   int
		answer    error
		wantCalls int
		want      dlq.Reason
	}{
		{"the biller answers the stored decision", 0, fault.New(fault.Transient, &billing.DeadLettered{Reason: "permanent", Cause: "refused"}), 1, dlq.Permanent},
		{"decided afresh, the stored reason kept", 0, fault.Errorf(fault.Transient, "unknown"), testMaxAttempts, dlq.Permanent},
		{"a replay is decided and stored afresh", 1, fault.Errorf(fault.Transient, "unknown"), testMaxAttempts, dlq.Exhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			biller := &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				return billing.Result{}, tc.answer
			}}
			decisions := &fakeDecisions{}
			e := newEnv(t, biller, nil, func(c *Config) { c.Decisions = decisions })
			msg, id := validRecord(t)
			if _, _, err := decisions.RecordDeadLetter(context.Background(), events.OrderConfirmed{EventID: id}, 0, "permanent", "refused"); err != nil {
				t.Fatal(err)
			}
			if tc.replays > 0 {
				msg.Headers = append(msg.Headers, kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte("1")})
			}
			if err := e.h.Handle(context.Background(), msg); err != nil {
				t.Fatal(err)
			}
			calls := e.dlq.calls()
			if len(calls) != 1 {
				t.Fatalf("%d dead letters; want one", len(calls))
			}
			if calls[0].reason != tc.want || callsOf(biller, id) != tc.wantCalls {
				t.Fatalf("dead letter %s after %d calls; want %s after %d", calls[0].reason, callsOf(biller, id), tc.want, tc.wantCalls)
			}
			if r, _, _ := decisions.RecordDeadLetter(context.Background(), events.OrderConfirmed{EventID: id}, tc.replays, "conflict", "x"); r != string(tc.want) {
				t.Errorf("decision stored %s; want %s", r, tc.want)
			}
		})
	}
}
