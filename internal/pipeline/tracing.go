package pipeline

import (
	"context"
	"strconv"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// Span attributes of the service's own, beside the semantic conventions'.
// The customer id and the amount are never attributes: a trace backend is
// not a place for who paid how much.
const (
	attrOrderID   = attribute.Key("billing.order_id")
	attrOutcome   = attribute.Key("billing.outcome")
	attrDLQReason = attribute.Key("billing.dlq.reason")
	attrAttempts  = attribute.Key("billing.attempts")
	attrFaultKind = attribute.Key("billing.fault.kind")
)

// startSpan continues the trace context of msg's headers, if any, in a
// consumer span. The returned ctx carries the span, so the payment call
// made under it is its child; with a no-op tracer it carries the incoming
// span context unchanged, which the payment client then propagates.
func (h *Handler) startSpan(ctx context.Context, msg kafka.Message) (context.Context, trace.Span) {
	ctx = h.cfg.Propagator.Extract(ctx, tracing.HeaderCarrier{Headers: &msg.Headers})
	ctx, span := h.cfg.Tracer.Start(ctx, "billing.process", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() { // no attribute is even built when nothing records
		span.SetAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(msg.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(msg.Partition)),
			semconv.MessagingKafkaOffsetKey.Int64(msg.Offset),
		)
	}
	return ctx, span
}

// spanEvent names the decoded event on ctx's span: its event_id (the
// message id) and order_id, nothing about the customer or the amount.
func spanEvent(ctx context.Context, ev events.OrderConfirmed) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(semconv.MessagingMessageID(ev.EventID.String()), attrOrderID.Int64(ev.OrderID))
	}
}

// spanOutcome records a billed event's outcome on ctx's span.
func spanOutcome(ctx context.Context, outcome string, attempts int) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrOutcome.String(outcome), attrAttempts.Int(attempts))
	}
}

// spanRetry marks on ctx's span that an attempt failed with kind and will
// be retried.
func spanRetry(ctx context.Context, kind fault.Kind) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("retry", trace.WithAttributes(attrFaultKind.String(kind.String())))
	}
}

// spanDeadLettered records on ctx's span that the record went to the DLQ.
// The span's status is Error with the reason only: the cause's text may
// quote the record's content.
func spanDeadLettered(ctx context.Context, reason dlq.Reason, attempts int) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrOutcome.String("dlq"), attrDLQReason.String(string(reason)), attrAttempts.Int(attempts))
		span.SetStatus(codes.Error, "dead-lettered: "+string(reason))
	}
}
