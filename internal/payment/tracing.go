package payment

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// startSpan starts the client span of one attempt. Its attributes are the
// method and path only: no amount, customer, token or Idempotency-Key.
func (c *Client) startSpan(ctx context.Context) (context.Context, trace.Span) {
	ctx, span := c.tracer.Start(ctx, "payment.charge", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(semconv.HTTPRequestMethodPost, semconv.URLPath(c.path))
	}
	return ctx, span
}

// endSpan records the attempt's answer: code is Observe's (a status or
// "error"), err Charge's.
func endSpan(span trace.Span, code string, err error) {
	if !span.IsRecording() {
		return
	}
	if status, convErr := strconv.Atoi(code); convErr == nil {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	if err != nil {
		errType := code
		if errType == "error" {
			errType = "no_answer"
		}
		// The kind, not the error's text, which quotes the endpoint.
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, fault.KindOf(err).String())
	}
}
