package dlq

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// The trace context of a record continues into its dead-letter record:
// extracted from either, it is the same, tracestate included, whatever the
// reason and however often the record was replayed.
func TestRecordKeepsTheTraceContext(t *testing.T) {
	src := source()
	src.Headers = append(src.Headers,
		kafka.Header{Key: "tracestate", Value: []byte("vendor=x")},
		kafka.Header{Key: HeaderReplayCount, Value: []byte("1")},
	)
	extract := func(hs []kafka.Header) trace.SpanContext {
		return trace.SpanContextFromContext(tracing.Propagator().Extract(context.Background(), tracing.HeaderCarrier{Headers: &hs}))
	}
	want := extract(src.Headers)
	if !want.IsValid() {
		t.Fatal("the source record has no valid trace context")
	}
	for _, reason := range []Reason{Invalid, Permanent, Conflict, Exhausted} {
		rec := Record(src, "billing-order-confirmed", reason, errors.New("boom"), 3, time.Now())
		if got := extract(rec.Headers); !got.Equal(want) {
			t.Errorf("%s: DLQ record trace context %v, want %v", reason, got, want)
		}
		if n := len(headerValues(rec.Headers, "traceparent")); n != 1 {
			t.Errorf("%s: %d traceparent headers, want 1", reason, n)
		}
	}
}
