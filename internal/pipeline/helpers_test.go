package pipeline

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
)

// Retry policy of the tests: tiny backoffs, so a test that retries a few
// dozen times still takes milliseconds.
const (
	testBackoffBase = time.Millisecond
	testBackoffMax  = 5 * time.Millisecond
	testMaxAttempts = 3
)

// fakeBiller is a Biller whose behaviour is a function; it records every
// event it is given.
type fakeBiller struct {
	process func(ctx context.Context, call int, ev events.OrderConfirmed) (billing.Result, error)

	mu     sync.Mutex
	events []events.OrderConfirmed
}

func (f *fakeBiller) Process(ctx context.Context, ev events.OrderConfirmed) (billing.Result, error) {
	f.mu.Lock()
	f.events = append(f.events, ev)
	call := len(f.events)
	f.mu.Unlock()
	return f.process(ctx, call, ev)
}

func (f *fakeBiller) calls() []events.OrderConfirmed {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]events.OrderConfirmed(nil), f.events...)
}

// dlqCall is one Send to a fakeDLQ.
type dlqCall struct {
	msg      kafka.Message
	reason   dlq.Reason
	cause    error
	attempts int
	err      error // what Send returned
}

// fakeDLQ is a DeadLetterer whose answer is a function; it records every
// call and whether some call was acknowledged (returned nil).
type fakeDLQ struct {
	send func(ctx context.Context, call int) error

	mu    sync.Mutex
	sends []dlqCall
	acked bool
}

func (f *fakeDLQ) Send(ctx context.Context, msg kafka.Message, reason dlq.Reason, cause error, attempts int) error {
	f.mu.Lock()
	call := len(f.sends) + 1
	f.mu.Unlock()
	var err error
	if f.send != nil {
		err = f.send(ctx, call)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sends = append(f.sends, dlqCall{msg: msg, reason: reason, cause: cause, attempts: attempts, err: err})
	if err == nil {
		f.acked = true
	}
	return err
}

func (f *fakeDLQ) calls() []dlqCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]dlqCall(nil), f.sends...)
}

func (f *fakeDLQ) isAcked() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acked
}

// fakeDecisions is a Decisions in memory, with the rule of
// billing.Service.RecordDeadLetter: a decision is kept unless the
// incoming record was replayed more often.
type fakeDecisions struct {
	mu   sync.Mutex
	byID map[uuid.UUID]fakeDecision
}

type fakeDecision struct {
	reason, cause string
	replays       int
}

func (f *fakeDecisions) RecordDeadLetter(_ context.Context, ev events.OrderConfirmed, replays int, reason, cause string) (string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID == nil {
		f.byID = map[uuid.UUID]fakeDecision{}
	}
	if d, ok := f.byID[ev.EventID]; ok && d.replays >= replays {
		return d.reason, d.cause, nil
	}
	f.byID[ev.EventID] = fakeDecision{reason, cause, replays}
	return reason, cause, nil
}

// testEnv is a Handler with fakes and its own metrics registry.
type testEnv struct {
	h       *Handler
	biller  *fakeBiller
	dlq     *fakeDLQ
	reg     *prometheus.Registry
	metrics *metrics.Metrics
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newEnv builds a Handler around biller and dl with the test retry policy;
// edit, when not nil, may change the Config first.
func newEnv(t *testing.T, biller *fakeBiller, dl *fakeDLQ, edit func(*Config)) *testEnv {
	t.Helper()
	if dl == nil {
		dl = &fakeDLQ{}
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, "test", "test")
	cfg := Config{
		Biller:      biller,
		DLQ:         dl,
		Decisions:   &fakeDecisions{},
		Metrics:     m,
		Logger:      discardLogger(),
		Now:         time.Now, // events carry the real time; far-future ones are invalid
		MaxAttempts: testMaxAttempts,
		BackoffBase: testBackoffBase,
		BackoffMax:  testBackoffMax,
	}
	if edit != nil {
		edit(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &testEnv{h: h, biller: biller, dlq: dl, reg: reg, metrics: m}
}

// counters returns every sample of the billing counters the pipeline
// updates, keyed like `billing_events_total{result="charged"}`, leaving out
// zero samples. Comparing the whole map proves that nothing else was
// counted. (It reads the registry rather than using
// prometheus/testutil, which would add kylelemons/godebug to go.mod.)
func (e *testEnv) counters(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		switch f.GetName() {
		case "billing_events_total", "billing_dlq_total", "billing_retries_total", "billing_dedup_out_of_range_total", "billing_deferred_decided_total":
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetCounter().GetValue() == 0 {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := f.GetName()
			if len(labels) > 0 {
				sort.Strings(labels)
				key += "{" + strings.Join(labels, ",") + "}"
			}
			out[key] = m.GetCounter().GetValue()
		}
	}
	return out
}

// Keys of counters().
func eventsKey(result string) string { return fmt.Sprintf("billing_events_total{result=%q}", result) }
func dlqKey(reason string) string    { return fmt.Sprintf("billing_dlq_total{reason=%q}", reason) }
func retriesKey(kind string) string  { return fmt.Sprintf("billing_retries_total{kind=%q}", kind) }

const outOfRangeKey = "billing_dedup_out_of_range_total"

func diffCounters(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s = %v, want 0", k, g)
		}
	}
}

// eventJSON is a valid order.confirmed.v1 record value.
func eventJSON(id uuid.UUID, occurred time.Time, orderID int64, amount string) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"event_type":"order.confirmed.v1","occurred_at":%q,"order_id":%d,"customer_id":42,"total_amount":%q}`,
		id.String(), occurred.UTC().Format(time.RFC3339), orderID, amount)
}

// record is a Kafka message carrying value, as the consumer hands it over.
func record(value []byte) kafka.Message {
	return kafka.Message{
		Topic: "order-service.order.confirmed", Partition: 2, Offset: 4711,
		Key: []byte("1001"), Value: value,
		Headers: []kafka.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}},
		Time:    time.Now(),
	}
}

// validRecord is a record of a fresh, valid event for order 1001 of 99.95.
func validRecord(t *testing.T) (kafka.Message, uuid.UUID) {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return record(eventJSON(id, time.Now(), 1001, "99.95")), id
}

// fakeClock is a Config.Now that moves only when a test says so. It starts
// at the real time, so that the events of validRecord are not in its
// future.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now()} }

func (c *fakeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

// callsOf counts the biller's calls for the event id.
func callsOf(b *fakeBiller, id uuid.UUID) int {
	n := 0
	for _, ev := range b.calls() {
		if ev.EventID == id {
			n++
		}
	}
	return n
}
