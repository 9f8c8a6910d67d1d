package pipeline

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// The traceparent of record(), split up.
const (
	inTraceID = "0af7651916cd43dd8448eb211c80319c"
	inSpanID  = "b7ad6b7169203331"
)

// capturingBiller returns a Biller that charges successfully and keeps the
// span context of the ctx it is given.
func capturingBiller(got *trace.SpanContext) *fakeBiller {
	return &fakeBiller{process: func(ctx context.Context, _ int, _ events.OrderConfirmed) (billing.Result, error) {
		*got = trace.SpanContextFromContext(ctx)
		return billing.Result{Outcome: billing.Charged}, nil
	}}
}

// With tracing off (no Tracer: a no-op one), the record's traceparent is
// still what the biller's ctx carries, so the payment call propagates it.
func TestIncomingTraceparentReachesTheBillerWithoutTracing(t *testing.T) {
	var got trace.SpanContext
	env := newEnv(t, capturingBiller(&got), nil, nil)
	msg, _ := validRecord(t)
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if !got.IsValid() || got.TraceID().String() != inTraceID || got.SpanID().String() != inSpanID || !got.IsSampled() {
		t.Errorf("biller saw span context %v, want trace %s, span %s, sampled", got, inTraceID, inSpanID)
	}
}

func TestNoTraceparentNoTraceContext(t *testing.T) {
	var got trace.SpanContext
	env := newEnv(t, capturingBiller(&got), nil, nil)
	msg, _ := validRecord(t)
	msg.Headers = nil
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got.IsValid() {
		t.Errorf("biller saw span context %v, want none", got)
	}
}

// recorder returns an SDK tracer whose ended spans are kept in memory.
func recorder(t *testing.T) (trace.Tracer, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer(tracing.ScopeName), sr
}

// spanNamed returns the one ended span called name.
func spanNamed(t *testing.T, sr *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d ended spans named %s, want 1", len(found), name)
	}
	return found[0]
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// mustNotNameTheCustomerOrAmount fails when a span attribute carries the
// customer or the amount.
func mustNotNameTheCustomerOrAmount(t *testing.T, s sdktrace.ReadOnlySpan, amount string) {
	t.Helper()
	for _, kv := range s.Attributes() {
		k := string(kv.Key)
		if strings.Contains(k, "customer") || strings.Contains(k, "amount") || kv.Value.String() == amount {
			t.Errorf("span %s has attribute %s=%s", s.Name(), k, kv.Value.String())
		}
	}
}

// A processed record gives a consumer span, child of the record's
// traceparent, and under it a client span per payment attempt, whose
// context the provider receives.
func TestSpansOfAProcessedRecord(t *testing.T) {
	tracer, sr := recorder(t)

	var mu sync.Mutex
	var seen []string // traceparent headers the provider received
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("traceparent"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"charge_id":"ch_1"}`))
	}))
	t.Cleanup(srv.Close)
	client, err := payment.New(payment.Config{BaseURL: srv.URL, Timeout: 5 * time.Second,
		Tracer: tracer, Propagator: tracing.Propagator()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.CloseIdleConnections)
	biller := &fakeBiller{process: func(ctx context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
		_, err := client.Charge(ctx, payment.Charge{IdempotencyKey: ev.EventID.String(), OrderID: ev.OrderID,
			CustomerID: ev.CustomerID, Amount: ev.TotalAmount})
		return billing.Result{Outcome: billing.Charged}, err
	}}
	env := newEnv(t, biller, nil, func(c *Config) { c.Tracer = tracer })

	msg, id := validRecord(t)
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	consumer := spanNamed(t, sr, "billing.process")
	client1 := spanNamed(t, sr, "payment.charge")
	if consumer.SpanKind() != trace.SpanKindConsumer || client1.SpanKind() != trace.SpanKindClient {
		t.Errorf("kinds %v, %v; want consumer, client", consumer.SpanKind(), client1.SpanKind())
	}
	if p := consumer.Parent(); !p.IsRemote() || p.TraceID().String() != inTraceID || p.SpanID().String() != inSpanID {
		t.Errorf("consumer span's parent %v, want the record's traceparent", p)
	}
	if consumer.SpanContext().TraceID().String() != inTraceID {
		t.Errorf("consumer span in trace %s, want %s", consumer.SpanContext().TraceID(), inTraceID)
	}
	if client1.Parent().SpanID() != consumer.SpanContext().SpanID() || client1.SpanContext().TraceID().String() != inTraceID {
		t.Errorf("payment span's parent %v, want the consumer span %v", client1.Parent(), consumer.SpanContext())
	}
	want := "00-" + inTraceID + "-" + client1.SpanContext().SpanID().String() + "-01"
	if len(seen) != 1 || seen[0] != want {
		t.Errorf("provider received traceparent %q, want [%s]", seen, want)
	}

	a := attrs(consumer)
	for k, v := range map[attribute.Key]string{
		"messaging.system":                   "kafka",
		"messaging.operation.type":           "process",
		"messaging.destination.name":         msg.Topic,
		"messaging.destination.partition.id": "2",
		"messaging.kafka.offset":             "4711",
		"messaging.message.id":               id.String(),
		"billing.order_id":                   "1001",
		"billing.outcome":                    "charged",
		"billing.attempts":                   "1",
	} {
		if got := a[k].String(); got != v {
			t.Errorf("consumer span %s = %q, want %q", k, got, v)
		}
	}
	if consumer.Status().Code != codes.Unset {
		t.Errorf("consumer span status %v, want unset", consumer.Status())
	}
	ca := attrs(client1)
	if ca["http.request.method"].AsString() != "POST" || ca["url.path"].AsString() != "/payments/charge" ||
		ca["http.response.status_code"].AsInt64() != 200 {
		t.Errorf("payment span attributes %v", client1.Attributes())
	}
	mustNotNameTheCustomerOrAmount(t, consumer, "99.95")
	mustNotNameTheCustomerOrAmount(t, client1, "99.95")
	for _, kv := range client1.Attributes() {
		if kv.Value.String() == id.String() {
			t.Errorf("payment span carries the idempotency key as %s", kv.Key)
		}
	}
}

// A record that cannot be billed ends its span in error with the DLQ
// reason, and the DLQ record keeps the record's traceparent.
func TestSpanOfADeadLetteredRecord(t *testing.T) {
	tracer, sr := recorder(t)
	dl := &fakeDLQ{}
	env := newEnv(t, &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
		return billing.Result{}, fault.New(fault.Permanent, errors.New("provider said 400"))
	}}, dl, func(c *Config) { c.Tracer = tracer })

	msg, _ := validRecord(t)
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	s := spanNamed(t, sr, "billing.process")
	if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "permanent") {
		t.Errorf("status %v, want an error naming the reason", s.Status())
	}
	a := attrs(s)
	if a["billing.outcome"].AsString() != "dlq" || a["billing.dlq.reason"].AsString() != "permanent" {
		t.Errorf("attributes %v", s.Attributes())
	}
	if strings.Contains(s.Status().Description, "400") {
		t.Errorf("status quotes the cause: %q", s.Status().Description)
	}

	calls := dl.calls()
	if len(calls) != 1 {
		t.Fatalf("%d DLQ sends, want 1", len(calls))
	}
	rec := dlq.Record(calls[0].msg, "g", calls[0].reason, calls[0].cause, calls[0].attempts, time.Now())
	if got := (tracing.HeaderCarrier{Headers: &rec.Headers}).Get("traceparent"); got != "00-"+inTraceID+"-"+inSpanID+"-01" {
		t.Errorf("DLQ record traceparent %q, want the record's", got)
	}
}

func TestSpanOfAnInvalidRecord(t *testing.T) {
	tracer, sr := recorder(t)
	env := newEnv(t, &fakeBiller{}, nil, func(c *Config) { c.Tracer = tracer })
	if err := env.h.Handle(context.Background(), record([]byte(`{"customer_id":42,"total_amount":"12.34"}`))); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	s := spanNamed(t, sr, "billing.process")
	a := attrs(s)
	if a["billing.dlq.reason"].AsString() != "invalid" || s.Status().Code != codes.Error {
		t.Errorf("attributes %v, status %v", s.Attributes(), s.Status())
	}
	if _, ok := a["messaging.message.id"]; ok {
		t.Error("an undecodable record has no event id to name")
	}
	mustNotNameTheCustomerOrAmount(t, s, "12.34")
}

func TestSpanRecordsRetries(t *testing.T) {
	tracer, sr := recorder(t)
	env := newEnv(t, &fakeBiller{process: func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
		if call == 1 {
			return billing.Result{}, fault.New(fault.Transient, errors.New("503"))
		}
		return billing.Result{Outcome: billing.Charged}, nil
	}}, nil, func(c *Config) { c.Tracer = tracer })
	msg, _ := validRecord(t)
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	s := spanNamed(t, sr, "billing.process")
	if ev := s.Events(); len(ev) != 1 || ev[0].Name != "retry" {
		t.Errorf("events %v, want one retry", ev)
	}
	if a := attrs(s); a["billing.attempts"].AsInt64() != 2 || a["billing.outcome"].AsString() != "charged" {
		t.Errorf("attributes %v", s.Attributes())
	}
}

// A record abandoned at shutdown ends its span in error.
func TestSpanOfAnAbandonedRecord(t *testing.T) {
	tracer, sr := recorder(t)
	ctx, cancel := context.WithCancel(context.Background())
	env := newEnv(t, &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
		cancel()
		return billing.Result{}, fault.New(fault.Transient, context.Canceled)
	}}, nil, func(c *Config) { c.Tracer = tracer })
	msg, _ := validRecord(t)
	if err := env.h.Handle(ctx, msg); !errors.Is(err, context.Canceled) {
		t.Fatalf("Handle: %v, want context.Canceled", err)
	}
	if s := spanNamed(t, sr, "billing.process"); s.Status().Code != codes.Error {
		t.Errorf("status %v, want error", s.Status())
	}
}
