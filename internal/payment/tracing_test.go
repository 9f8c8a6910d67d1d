package payment

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

const (
	inTraceID     = "0af7651916cd43dd8448eb211c80319c"
	inSpanID      = "b7ad6b7169203331"
	inTraceparent = "00-" + inTraceID + "-" + inSpanID + "-01"
)

// seenRequest is what the provider received.
type seenRequest struct {
	header http.Header
	body   []byte
}

// recordingProvider answers status to every request and keeps them.
type recordingProvider struct {
	status int
	mu     sync.Mutex
	seen   []seenRequest
}

func (p *recordingProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.seen = append(p.seen, seenRequest{header: r.Header.Clone(), body: body})
	p.mu.Unlock()
	w.WriteHeader(p.status)
	_, _ = w.Write([]byte(`{"charge_id":"ch_1"}`))
}

func (p *recordingProvider) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.seen...)
}

// incomingCtx is a ctx carrying the trace context of a record whose
// traceparent was inTraceparent, as the pipeline hands it over.
func incomingCtx() context.Context {
	return tracing.Propagator().Extract(context.Background(),
		propagation.MapCarrier{"traceparent": inTraceparent, "tracestate": "vendor=x"})
}

// chargeOnce makes one successful Charge with a client configured by
// mutate and returns what the provider received.
func chargeOnce(t *testing.T, ctx context.Context, mutate func(*Config)) seenRequest {
	t.Helper()
	p := &recordingProvider{status: http.StatusOK}
	srv := serve(t, p)
	c := newClient(t, srv.URL, mutate)
	if _, err := c.Charge(ctx, testCharge()); err != nil {
		t.Fatalf("Charge: %v", err)
	}
	reqs := p.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	return reqs[0]
}

// With tracing off (no tracer, or a no-op one) the record's traceparent
// reaches the provider unchanged: same trace, and the producer's span as
// parent since no span of ours was recorded.
func TestIncomingTraceparentReachesTheProvider(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for name, tracer := range map[string]trace.Tracer{"no tracer": nil, "noop tracer": noop.NewTracerProvider().Tracer("")} {
			t.Run(name, func(t *testing.T) {
				got := chargeOnce(t, incomingCtx(), func(c *Config) {
					c.Propagator = tracing.Propagator()
					c.Tracer = tracer
				})
				if tp := got.header.Get("traceparent"); tp != inTraceparent {
					t.Errorf("traceparent %q, want %q", tp, inTraceparent)
				}
				if ts := got.header.Get("tracestate"); ts != "vendor=x" {
					t.Errorf("tracestate %q, want vendor=x", ts)
				}
			})
		}
	})
}

// Without an incoming traceparent and with tracing off, nothing is sent: a
// no-op span has an invalid span context, which W3C injection skips.
func TestNoTraceContextNoHeader(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for name, tracer := range map[string]trace.Tracer{"no tracer": nil, "noop tracer": noop.NewTracerProvider().Tracer("")} {
			t.Run(name, func(t *testing.T) {
				got := chargeOnce(t, context.Background(), func(c *Config) {
					c.Propagator = tracing.Propagator()
					c.Tracer = tracer
				})
				for _, h := range []string{"traceparent", "tracestate"} {
					if v, ok := got.header[http.CanonicalHeaderKey(h)]; ok {
						t.Errorf("%s sent: %q", h, v)
					}
				}
			})
		}
	})
}

// Without a propagator no trace context is sent, whatever ctx carries.
func TestNoPropagatorNoInjection(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		got := chargeOnce(t, incomingCtx(), nil)
		if v := got.header.Get("traceparent"); v != "" {
			t.Errorf("traceparent %q sent without a propagator", v)
		}
	})
}

// Tracing changes neither the body nor any header the provider relies on:
// it only adds traceparent (and tracestate).
func TestTracingLeavesBodyAndHeadersAlone(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		tp := sdktrace.NewTracerProvider()
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		plain := chargeOnce(t, context.Background(), nil)
		traced := chargeOnce(t, incomingCtx(), func(c *Config) {
			c.Propagator = tracing.Propagator()
			c.Tracer = tp.Tracer(tracing.ScopeName)
		})
		if !bytes.Equal(plain.body, traced.body) || !bytes.Equal(traced.body, testCharge().Body()) {
			t.Errorf("bodies differ:\nplain  %s\ntraced %s", plain.body, traced.body)
		}
		for _, h := range []string{"Idempotency-Key", "Authorization", "Content-Type", "Accept", "Content-Length"} {
			if plain.header.Get(h) != traced.header.Get(h) || plain.header.Get(h) == "" {
				t.Errorf("%s: plain %q, traced %q", h, plain.header.Get(h), traced.header.Get(h))
			}
		}
		for k := range traced.header {
			if _, ok := plain.header[k]; !ok && k != "Traceparent" && k != "Tracestate" {
				t.Errorf("tracing added header %s", k)
			}
		}
		if tp := traced.header.Get("traceparent"); !strings.HasPrefix(tp, "00-"+inTraceID+"-") || strings.Contains(tp, inSpanID) {
			t.Errorf("traceparent %q, want the incoming trace with our client span as parent", tp)
		}
	})
}

// hostilePropagator writes headers it has no business writing.
type hostilePropagator struct{}

func (hostilePropagator) Inject(_ context.Context, c propagation.TextMapCarrier) {
	c.Set("Idempotency-Key", "forged")
	c.Set("Authorization", "Bearer forged")
	c.Set("Content-Type", "text/plain")
	c.Set("traceparent", inTraceparent)
}
func (hostilePropagator) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context {
	return ctx
}
func (hostilePropagator) Fields() []string { return nil }

func TestPropagatorCannotOverrideTheProviderHeaders(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		got := chargeOnce(t, context.Background(), func(c *Config) { c.Propagator = hostilePropagator{} })
		if k := got.header.Get("Idempotency-Key"); k != testCharge().IdempotencyKey {
			t.Errorf("Idempotency-Key %q", k)
		}
		if a := got.header.Get("Authorization"); a != "Bearer "+testToken {
			t.Error("Authorization was overridden")
		}
		if ct := got.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
	})
}

// Every attempt is a client span of its own, child of the caller's span,
// and its context is the one the provider receives.
func TestClientSpanPerAttempt(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		sr := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		tracer := tp.Tracer(tracing.ScopeName)

		p := &recordingProvider{status: http.StatusServiceUnavailable}
		srv := serve(t, p)
		c := newClient(t, srv.URL, func(c *Config) {
			c.Propagator = tracing.Propagator()
			c.Tracer = tracer
		})
		ctx, parent := tracer.Start(incomingCtx(), "billing.process")
		for range 2 {
			if _, err := c.Charge(ctx, testCharge()); err == nil {
				t.Fatal("a 503 must fail")
			}
		}
		parent.End()

		var spans []sdktrace.ReadOnlySpan
		for _, s := range sr.Ended() {
			if s.Name() == "payment.charge" {
				spans = append(spans, s)
			}
		}
		reqs := p.requests()
		if len(spans) != 2 || len(reqs) != 2 {
			t.Fatalf("%d spans, %d requests; want 2 each", len(spans), len(reqs))
		}
		for i, s := range spans {
			if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindClient {
				t.Errorf("span %d: parent %v kind %v", i, s.Parent(), s.SpanKind())
			}
			want := "00-" + inTraceID + "-" + s.SpanContext().SpanID().String() + "-01"
			if got := reqs[i].header.Get("traceparent"); got != want {
				t.Errorf("attempt %d sent traceparent %q, want %q", i, got, want)
			}
			if s.Status().Code != codes.Error || s.Status().Description != "transient" {
				t.Errorf("span %d status %v, want error transient", i, s.Status())
			}
			a := map[attribute.Key]attribute.Value{}
			for _, kv := range s.Attributes() {
				a[kv.Key] = kv.Value
				if v := kv.Value.String(); strings.Contains(v, "99") || v == testCharge().IdempotencyKey || strings.Contains(v, testToken) {
					t.Errorf("span %d attribute %s=%s", i, kv.Key, v)
				}
			}
			if a["http.response.status_code"].AsInt64() != 503 || a["error.type"].AsString() != "503" || a["http.request.method"].AsString() != "POST" {
				t.Errorf("span %d attributes %v", i, s.Attributes())
			}
		}
	})
}

func TestClientSpanWithoutAnswer(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		sr := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close() // reset: no answer
			}
		}))
		c := newClient(t, srv.URL, func(c *Config) { c.Tracer = tp.Tracer(tracing.ScopeName) })
		if _, err := c.Charge(context.Background(), testCharge()); err == nil {
			t.Fatal("a reset must fail")
		}
		ended := sr.Ended()
		if len(ended) != 1 {
			t.Fatalf("%d spans, want 1", len(ended))
		}
		s := ended[0]
		for _, kv := range s.Attributes() {
			if kv.Key == "http.response.status_code" {
				t.Error("no answer, yet a status code")
			}
			if kv.Key == "error.type" && kv.Value.AsString() != "no_answer" {
				t.Errorf("error.type %q", kv.Value.AsString())
			}
		}
		if s.Status().Code != codes.Error {
			t.Errorf("status %v", s.Status())
		}
	})
}
