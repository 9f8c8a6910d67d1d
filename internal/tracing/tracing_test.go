package tracing

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// env is a getenv over a map.
func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestSetupWithoutEndpointIsNoop(t *testing.T) {
	for name, vars := range map[string]map[string]string{
		"unset":    {},
		"blank":    {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "},
		"disabled": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
	} {
		t.Run(name, func(t *testing.T) {
			tp, shutdown, err := Setup(context.Background(), env(vars), discard(), "billing-consumer", "test")
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			if _, ok := tp.(noop.TracerProvider); !ok {
				t.Errorf("provider is %T, want noop.TracerProvider", tp)
			}
			_, span := tp.Tracer(ScopeName).Start(context.Background(), "x")
			if span.IsRecording() || span.SpanContext().IsValid() {
				t.Error("a no-op provider must record nothing")
			}
			span.End()
			if err := shutdown(context.Background()); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		})
	}
}

func TestSetupRejectsABadEndpoint(t *testing.T) {
	tests := []struct {
		vars map[string]string
		want string // the variable named by the error
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://collector"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/?x=1"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/%zz"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "localhost"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
	}
	for _, tt := range tests {
		_, _, err := Setup(context.Background(), env(tt.vars), discard(), "billing-consumer", "test")
		if err == nil || !strings.HasPrefix(err.Error(), tt.want+":") {
			t.Errorf("%v: error %v, want one naming %s", tt.vars, err, tt.want)
		}
	}
}

func TestTracesURL(t *testing.T) {
	tests := []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "http://collector:4318/v1/traces"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318/otlp/"}, "https://collector:4318/otlp/v1/traces"},
		// The per-signal variable is used as it is, and wins.
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/custom"}, "http://b:4318/custom"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318"}, "http://b:4318"},
	}
	for _, tt := range tests {
		got, err := tracesURL(env(tt.vars))
		if err != nil || got != tt.want {
			t.Errorf("%v: %q, %v; want %q", tt.vars, got, err, tt.want)
		}
	}
}

// collector is an OTLP/HTTP receiver: it keeps every export request
// posted to /v1/traces.
type collector struct {
	mu       sync.Mutex
	requests []*coltrace.ExportTraceServiceRequest
	paths    []string
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.requests = append(c.requests, &req)
	c.paths = append(c.paths, r.URL.Path)
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func TestSetupExportsOverOTLPHTTP(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	t.Cleanup(srv.Close)

	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	tp, shutdown, err := Setup(context.Background(), env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}),
		logger, "billing-consumer", "v1.2.3")
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if _, ok := tp.(*sdktrace.TracerProvider); !ok {
		t.Fatalf("provider is %T, want the SDK's", tp)
	}
	_, span := tp.Tracer(ScopeName).Start(context.Background(), "billing.process")
	if !span.IsRecording() {
		t.Fatal("the SDK provider must record")
	}
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil { // flushes the batch
		t.Fatalf("shutdown: %v", err)
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.requests) == 0 {
		t.Fatal("no export reached the collector")
	}
	if col.paths[0] != "/v1/traces" {
		t.Errorf("exported to %s, want /v1/traces", col.paths[0])
	}
	var names []string
	attrs := map[string]string{}
	for _, req := range col.requests {
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
	}
	if len(names) != 1 || names[0] != "billing.process" {
		t.Errorf("exported spans %q, want [billing.process]", names)
	}
	if attrs["service.name"] != "billing-consumer" || attrs["service.version"] != "v1.2.3" {
		t.Errorf("resource %v lacks service.name/version", attrs)
	}
	if !strings.Contains(logs.String(), "tracing enabled") {
		t.Errorf("no startup line in the log: %s", logs.String())
	}
}

// failingExporter fails while fail is set.
type failingExporter struct {
	tracetest.NoopExporter
	fail bool
}

func (e *failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	if e.fail {
		return errors.New("collector unreachable")
	}
	return nil
}

func TestExportFailuresAreLoggedOncePerStateChange(t *testing.T) {
	var logs bytes.Buffer
	inner := &failingExporter{fail: true}
	e := &loggingExporter{SpanExporter: inner, logger: slog.New(slog.NewTextHandler(&logs, nil))}
	for range 3 {
		if err := e.ExportSpans(context.Background(), nil); err != nil {
			t.Fatalf("ExportSpans returned %v: it must not reach the global error handler", err)
		}
	}
	inner.fail = false
	for range 2 {
		_ = e.ExportSpans(context.Background(), nil)
	}
	inner.fail = true
	_ = e.ExportSpans(context.Background(), nil)
	out := logs.String()
	if n := strings.Count(out, "span export failing"); n != 2 {
		t.Errorf("%d failure lines, want 2 (one per failing streak):\n%s", n, out)
	}
	if n := strings.Count(out, "span export recovered"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, out)
	}
}
