package tracing

import (
	"context"
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"
)

const incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestHeaderCarrierGet(t *testing.T) {
	hs := []kafka.Header{
		{Key: "content-type", Value: []byte("application/json")},
		{Key: "TraceParent", Value: []byte(incoming)},
		{Key: "traceparent", Value: []byte("second")},
	}
	c := HeaderCarrier{Headers: &hs}
	tests := map[string]string{
		"traceparent":  incoming, // first match, whatever its case
		"TRACEPARENT":  incoming,
		"content-type": "application/json",
		"tracestate":   "",
	}
	for key, want := range tests {
		if got := c.Get(key); got != want {
			t.Errorf("Get(%q) = %q, want %q", key, got, want)
		}
	}
	if got, want := c.Keys(), []string{"content-type", "TraceParent", "traceparent"}; !slices.Equal(got, want) {
		t.Errorf("Keys() = %q, want %q", got, want)
	}
}

func TestHeaderCarrierSetReplacesWithoutTouchingTheOriginal(t *testing.T) {
	orig := []kafka.Header{
		{Key: "traceparent", Value: []byte("old-1")},
		{Key: "k", Value: []byte("v")},
		{Key: "TRACEPARENT", Value: []byte("old-2")},
	}
	hs := orig
	c := HeaderCarrier{Headers: &hs}
	c.Set("traceparent", incoming)
	want := []kafka.Header{{Key: "k", Value: []byte("v")}, {Key: "traceparent", Value: []byte(incoming)}}
	if !equalHeaders(hs, want) {
		t.Errorf("after Set: %v, want %v", hs, want)
	}
	// The record the slice came from is shared (the DLQ writes its
	// headers): Set must not have written into its backing array.
	if string(orig[0].Value) != "old-1" || string(orig[2].Value) != "old-2" || len(orig) != 3 {
		t.Errorf("Set changed the original headers: %v", orig)
	}
	c.Set("tracestate", "a=b")
	if got := c.Get("tracestate"); got != "a=b" {
		t.Errorf("Get after Set = %q", got)
	}
}

func TestHeaderCarrierNil(t *testing.T) {
	var c HeaderCarrier
	c.Set("traceparent", incoming) // no panic
	if c.Get("traceparent") != "" || c.Keys() != nil {
		t.Error("a carrier without headers must be empty")
	}
	var empty []kafka.Header
	c = HeaderCarrier{Headers: &empty}
	if c.Get("traceparent") != "" || len(c.Keys()) != 0 {
		t.Error("empty headers must yield nothing")
	}
}

// The propagator of the service reads and writes Kafka headers through the
// carrier: what is injected is extracted unchanged.
func TestHeaderCarrierRoundTrip(t *testing.T) {
	hs := []kafka.Header{{Key: "traceparent", Value: []byte(incoming)}, {Key: "tracestate", Value: []byte("vendor=x")}}
	ctx := Propagator().Extract(context.Background(), HeaderCarrier{Headers: &hs})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" ||
		sc.SpanID().String() != "b7ad6b7169203331" || !sc.IsSampled() || sc.TraceState().Get("vendor") != "x" {
		t.Fatalf("extracted %+v", sc)
	}
	var out []kafka.Header
	Propagator().Inject(ctx, HeaderCarrier{Headers: &out})
	c := HeaderCarrier{Headers: &out}
	if c.Get("traceparent") != incoming || c.Get("tracestate") != "vendor=x" {
		t.Errorf("injected %v", out)
	}
	// Baggage is not propagated.
	if slices.Contains(Propagator().Fields(), "baggage") {
		t.Error("the propagator must not carry baggage")
	}
}

func TestHeaderCarrierIgnoresAMalformedTraceparent(t *testing.T) {
	for _, v := range []string{"", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01", "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"} {
		hs := []kafka.Header{{Key: "traceparent", Value: []byte(v)}}
		ctx := Propagator().Extract(context.Background(), HeaderCarrier{Headers: &hs})
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			t.Errorf("traceparent %q extracted as valid %v", v, sc)
		}
	}
}

func equalHeaders(a, b []kafka.Header) bool {
	return slices.EqualFunc(a, b, func(x, y kafka.Header) bool { return x.Key == y.Key && string(x.Value) == string(y.Value) })
}
