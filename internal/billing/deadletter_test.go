package billing_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/pipeline"
)

// phasedCharger answers every request with the charger of the current
// phase and counts the requests of each phase.
type phasedCharger struct {
	mu     sync.Mutex
	phase  int
	by     []billing.Charger
	counts []int
}

func (p *phasedCharger) Charge(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
	p.mu.Lock()
	c := p.by[p.phase]
	p.counts[p.phase]++
	p.mu.Unlock()
	return c.Charge(ctx, ch)
}

func (p *phasedCharger) next() { p.mu.Lock(); p.phase++; p.mu.Unlock() }

func (p *phasedCharger) sent(phase int) int { p.mu.Lock(); defer p.mu.Unlock(); return p.counts[phase] }

// kafkaRecord is ev's record as the consumer hands it to the pipeline,
// replayed count times by `dlq replay` (count 0: never).
func kafkaRecord(ev events.OrderConfirmed, count int) kafka.Message {
	r := recordOf(ev)
	m := kafka.Message{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Time: r.Time}
	for _, h := range r.Headers {
		m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	if count > 0 {
		m.Headers = append(m.Headers, kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte{byte('0' + count)}})
	}
	return m
}

// SPEC §11 I2 (the model's known violation before migration 00012): a
// record dead-lettered `permanent` whose offset commit is lost is
// delivered again. Its claim was released on the refusal; decided afresh,
// it would claim again and send, and with the provider's answers lost
// until its budget ends, be dead-lettered a second time, `exhausted`: two
// reasons. The stored decision answers the redelivery instead: the same
// dead letter, `permanent`, nothing claimed, nothing sent. A `dlq replay`
// of it (dlq-replay-count 1) is decided afresh and charged; a late
// redelivery of the original record then finds the charge (a duplicate),
// never the spent dead letter.
func TestARedeliveredDeadLetterKeepsItsReason(t *testing.T) {
	e := newEnv(t, "secret-token")
	charger := &phasedCharger{counts: make([]int, 3), by: []billing.Charger{
		gatewayNotFound(t).ForBilling(), // a definite refusal (404): permanent, the claim released
		chargerFunc(func(context.Context, billing.ChargeRequest) (billing.ChargeResult, error) {
			return billing.ChargeResult{}, &payment.Error{Kind: fault.Transient} // no answer: unknown
		}),
		e.charger, // the provider, which has never seen the key
	}}
	svc := newService(t, e.pool, charger)
	dl := &dlqRecorder{}
	h, err := pipeline.New(pipeline.Config{Biller: svc, DLQ: dl, Decisions: svc, Metrics: metrics.New(prometheus.NewRegistry(), "test", "test"),
		Logger: discard(), Now: time.Now, MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reasons := func() []dlq.Reason { dl.mu.Lock(); defer dl.mu.Unlock(); return slices.Clone(dl.why) }
	ctx := context.Background()
	ev := event(30001, 2500)

	if err := h.Handle(ctx, kafkaRecord(ev, 0)); err != nil {
		t.Fatal(err)
	}
	if got := reasons(); !slices.Equal(got, []dlq.Reason{dlq.Permanent}) || e.status(t, ev.OrderID) != "" {
		t.Fatalf("first delivery: dead letters %v, claim %q; want [permanent], released", got, e.status(t, ev.OrderID))
	}

	charger.next() // the provider's answers are lost from now on
	if err := h.Handle(ctx, kafkaRecord(ev, 0)); err != nil {
		t.Fatal(err)
	}
	got := reasons()
	t.Logf("redelivery: dead letters %v, %d requests sent, claim %q", got, charger.sent(1), e.status(t, ev.OrderID))
	if !slices.Equal(got, []dlq.Reason{dlq.Permanent, dlq.Permanent}) {
		t.Errorf("dead letters of one event %v; want [permanent permanent]: one reason (SPEC §11 I2)", got)
	}
	if charger.sent(1) != 0 || e.status(t, ev.OrderID) != "" {
		t.Errorf("the redelivery sent %d requests, claim %q; want none, none: it was decided before", charger.sent(1), e.status(t, ev.OrderID))
	}
	if t.Failed() {
		return
	}

	charger.next() // the operator replays the dead letter; the provider answers
	if err := h.Handle(ctx, kafkaRecord(ev, 1)); err != nil {
		t.Fatal(err)
	}
	if got := reasons(); len(got) != 2 {
		t.Errorf("the replay was dead-lettered again: %v; want it decided afresh, charged", got)
	}
	e.assertChargedOnce(t, ev)

	res, err := svc.Process(billing.WithAttempt(ctx), ev) // the original record, late: the money decides
	if err != nil || res.Outcome != billing.Duplicate {
		t.Errorf("a late redelivery of the original record after the replay's charge: %+v, %v; want duplicate", res, err)
	}
}

// SPEC §11 I2, the corner a replay leaves: a record dead-lettered
// `permanent` is replayed (dlq-replay-count 1) after another event of its
// order charged the order, and the replay is decided duplicate_order. A
// late redelivery of the original record (count 0) must be decided as the
// event was since, duplicate_order, never answered by the spent dead
// letter: that trace would say both.
func TestALateOriginalAfterAReplayIsNotAnsweredByTheSpentDeadLetter(t *testing.T) {
	e := newEnv(t, "secret-token")
	charger := &phasedCharger{counts: make([]int, 2), by: []billing.Charger{
		gatewayNotFound(t).ForBilling(), // a definite refusal (404): permanent, the claim released
		e.charger,                       // the provider charges the other event
	}}
	svc := newService(t, e.pool, charger)
	dl := &dlqRecorder{}
	h, err := pipeline.New(pipeline.Config{Biller: svc, DLQ: dl, Decisions: svc, Metrics: metrics.New(prometheus.NewRegistry(), "test", "test"),
		Logger: discard(), Now: time.Now, MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reasons := func() []dlq.Reason { dl.mu.Lock(); defer dl.mu.Unlock(); return slices.Clone(dl.why) }
	ctx := context.Background()
	ev, other := event(30002, 2500), event(30002, 2500)

	if err := h.Handle(ctx, kafkaRecord(ev, 0)); err != nil {
		t.Fatal(err)
	}
	if got := reasons(); !slices.Equal(got, []dlq.Reason{dlq.Permanent}) {
		t.Fatalf("first delivery: dead letters %v; want [permanent]", got)
	}
	charger.next()
	if res, err := svc.Process(billing.WithAttempt(ctx), other); err != nil || res.Outcome != billing.Charged {
		t.Fatalf("the other event of the order: %+v, %v; want charged", res, err)
	}
	// The operator replays the dead letter: decided afresh, duplicate_order.
	replay, err := svc.Process(billing.WithAttempt(billing.WithReplayCount(ctx, 1)), ev)
	if err != nil || replay.Outcome != billing.DuplicateOrder {
		t.Fatalf("the replay: %+v, %v; want duplicate_order", replay, err)
	}

	late, err := svc.Process(billing.WithAttempt(billing.WithReplayCount(ctx, 0)), ev)
	t.Logf("the late original after the replay's duplicate_order: %+v, %v", late, err)
	if d, ok := billing.AsDeadLettered(err); ok {
		t.Fatalf("the late original record was answered by the dead letter the replay spent (%s), though the replay decided the event duplicate_order: two decisions (SPEC §11 I2)", d.Reason)
	}
	if err != nil || late.Outcome != billing.DuplicateOrder {
		t.Errorf("the late original record: %+v, %v; want duplicate_order, as the replay decided", late, err)
	}
	if got := reasons(); len(got) != 1 {
		t.Errorf("dead letters %v; want the first one only", got)
	}
	e.assertChargedOnce(t, other)
}

// The replay's claim statement leaves the row without a decision: a late
// original record is decided afresh, and a dead letter it gets becomes
// the decision at the replay's count, so that a redelivery of the replay
// (whose first processing died after its claim) is answered by it, one
// reason (SPEC §11 I2), nothing sent.
func TestADeadLetterAfterTheReplaysClaimAnswersTheReplay(t *testing.T) {
	e := newEnv(t, "secret-token")
	var sent atomic.Int32
	svc := newService(t, e.pool, chargerFunc(func(context.Context, billing.ChargeRequest) (billing.ChargeResult, error) {
		sent.Add(1)
		return billing.ChargeResult{}, &payment.Error{Kind: fault.Transient} // no answer: unknown
	}))
	ctx := context.Background()
	ev := event(30003, 2500)
	if r, _, err := svc.RecordDeadLetter(ctx, ev, 0, "permanent", "refused"); err != nil || r != "permanent" {
		t.Fatalf("the original's dead letter: %q, %v", r, err)
	}
	// The replay claims, sends, and its process dies (the answer lost).
	if _, err := svc.Process(billing.WithAttempt(billing.WithReplayCount(ctx, 1)), ev); fault.KindOf(err) != fault.Transient {
		t.Fatalf("the replay: %v; want a transient error, its claim pending", err)
	}
	// The late original record is decided afresh and dead-lettered.
	r, c, err := svc.RecordDeadLetter(ctx, ev, 0, "exhausted", "no answer")
	if err != nil || r != "exhausted" || c != "no answer" {
		t.Fatalf("the late original's dead letter after the replay's claim: %q %q, %v; want its own, exhausted: the replay spent the permanent one", r, c, err)
	}
	before := sent.Load()
	_, err = svc.Process(billing.WithAttempt(billing.WithReplayCount(ctx, 1)), ev)
	d, ok := billing.AsDeadLettered(err)
	if !ok || d.Reason != "exhausted" || sent.Load() != before {
		t.Errorf("the replay's redelivery: %v, %d requests sent; want the late original's dead letter, exhausted, nothing sent", err, sent.Load()-before)
	}
}
