package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// The lines the pipeline logs while it handles a record are written inside
// its span: with the service's log handler they carry the span's trace_id
// and span_id, so a DLQ log line leads to the trace of its event.
func TestLogLinesCarryTheSpan(t *testing.T) {
	var buf bytes.Buffer
	tracer, sr := recorder(t)
	env := newEnv(t, capturingBiller(new(trace.SpanContext)), nil, func(c *Config) {
		c.Tracer = tracer
		c.Logger = slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil)))
	})
	msg, _ := validRecord(t)
	msg.Value = []byte("not an event")
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	span := spanNamed(t, sr, "billing.process")
	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if strings.Contains(l, "record dead-lettered") {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line == nil {
		t.Fatalf("no dead-letter log line:\n%s", buf.String())
	}
	if line["trace_id"] != span.SpanContext().TraceID().String() || line["span_id"] != span.SpanContext().SpanID().String() {
		t.Errorf("dead-letter line %v, want trace_id %s and span_id %s of the span", line, span.SpanContext().TraceID(), span.SpanContext().SpanID())
	}
}
