// Package tracing sets up OpenTelemetry tracing: W3C trace context
// propagation, always, and span export over OTLP/HTTP when the standard
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set. Nothing is registered globally (no otel.SetTracerProvider, no
// otel.SetTextMapPropagator): the provider and the propagator are passed to
// whoever needs them.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/billing-consumer/billing-consumer/internal/redact"
)

// ScopeName is the instrumentation scope of the service's own spans.
const ScopeName = "github.com/billing-consumer/billing-consumer"

// The standard variables Setup reads through getenv.
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envSDKDisabled    = "OTEL_SDK_DISABLED"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// tracesPath is appended to OTEL_EXPORTER_OTLP_ENDPOINT, a base URL; the
// per-signal OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is.
const tracesPath = "v1/traces"

// Propagator returns the propagator of the service: W3C trace context
// (traceparent, tracestate) only. Baggage is deliberately not propagated:
// whatever a producer put there would travel on to the payment provider.
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }

// Setup returns the TracerProvider of the service and the function that
// flushes and stops it; call shutdown once, at exit, with a bounded ctx.
//
// Unless OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
// is set (and OTEL_SDK_DISABLED is not "true"), the provider is a no-op:
// nothing is recorded or exported, and spans started from a context that
// carries an incoming trace context keep it, so it still propagates.
// Otherwise spans are batched and exported over OTLP/HTTP to that endpoint,
// with service.name and service.version set to serviceName and version.
//
// getenv is the environment (cmd passes os.Getenv); Setup reads the
// variables above through it. The SDK and the exporter also read the rest
// of the standard OTEL_* variables themselves (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, _PROTOCOL, OTEL_TRACES_SAMPLER,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, ...): that is their
// documented contract, which operators expect, so it is not re-implemented
// here. A failing export is logged to logger once when exports start
// failing and once when they recover, never per span.
//
// The error names the variable when an endpoint is not an absolute http or
// https URL, or when the protocol asked for is gRPC.
func Setup(ctx context.Context, getenv func(string) string, logger *slog.Logger, serviceName, version string) (trace.TracerProvider, func(context.Context) error, error) {
	noShutdown := func(context.Context) error { return nil }
	if strings.EqualFold(strings.TrimSpace(getenv(envSDKDisabled)), "true") {
		return noop.NewTracerProvider(), noShutdown, nil
	}
	endpoint, err := tracesURL(getenv)
	if err != nil || endpoint == "" {
		return noop.NewTracerProvider(), noShutdown, err
	}
	if err := checkProtocol(getenv); err != nil {
		return nil, nil, err
	}
	// The endpoint is given explicitly, from getenv, rather than left to
	// the exporter's own reading of the environment, so that what decides
	// whether to export and where it goes are the same value.
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the defaults given here, as the specification requires.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(serviceName), semconv.ServiceVersion(version)),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: resource (OTEL_RESOURCE_ATTRIBUTES?): %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(&loggingExporter{SpanExporter: exp, logger: logger}),
		sdktrace.WithResource(res),
	)
	logger.Info("tracing enabled, exporting spans over OTLP/HTTP", "endpoint", redact.String(endpoint))
	return tp, tp.Shutdown, nil
}

// tracesURL returns the URL spans are posted to, or "" when no endpoint is
// set.
func tracesURL(getenv func(string) string) (string, error) {
	name, raw := envTracesEndpoint, strings.TrimSpace(getenv(envTracesEndpoint))
	if raw == "" {
		name, raw = envEndpoint, strings.TrimSpace(getenv(envEndpoint))
	}
	if raw == "" {
		return "", nil
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		// url's errors quote the URL, which may hold credentials.
		return "", fmt.Errorf("%s: does not parse as a URL", name)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%s: must be an absolute http or https URL", name)
	case u.Host == "" || u.Opaque != "":
		return "", fmt.Errorf("%s: has no host", name)
	case u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("%s: must not have a query or fragment", name)
	}
	if name == envEndpoint {
		u = u.JoinPath(tracesPath)
	}
	return u.String(), nil
}

// checkProtocol refuses OTLP over gRPC, which this binary does not carry
// (the exporter would silently post HTTP to a gRPC port).
func checkProtocol(getenv func(string) string) error {
	name, p := envTracesProtocol, strings.TrimSpace(getenv(envTracesProtocol))
	if p == "" {
		name, p = envProtocol, strings.TrimSpace(getenv(envProtocol))
	}
	switch p {
	case "", "http/protobuf", "http/json":
		return nil
	}
	return fmt.Errorf("%s: %q is not supported, only http/protobuf or http/json (OTLP over HTTP, port 4318)", name, p)
}

// loggingExporter logs failed exports to logger instead of leaving them to
// otel's global error handler, which writes unstructured lines to stderr.
// It logs state changes only: the first failure, then the recovery.
type loggingExporter struct {
	sdktrace.SpanExporter
	logger  *slog.Logger
	failing atomic.Bool
}

// ExportSpans exports spans. Its error is logged, not returned: the batch
// is dropped either way, and a returned error would also reach the global
// handler.
func (e *loggingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	switch {
	case err != nil && !e.failing.Swap(true):
		e.logger.Warn("span export failing, spans are dropped until it recovers", "err", err)
	case err == nil && e.failing.Swap(false):
		e.logger.Info("span export recovered")
	}
	return nil
}
