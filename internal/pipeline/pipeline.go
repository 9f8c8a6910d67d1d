// Package pipeline turns one Kafka record into a finished outcome: decode
// and validate it, bill it with retries, or dead-letter it. Its Handle is
// the consumer's handler: it returns nil only when the record may be
// committed.
//
// What happens to a failure depends on its fault.Kind:
//
//	Invalid                → DLQ "invalid", no retry
//	Permanent, Conflict    → DLQ "permanent" / "conflict", no retry
//	Transient              → retry with capped exponential backoff and
//	                         jitter, then DLQ "exhausted"
//	Systemic               → retry without limit, marked unready: a
//	                         database outage or rejected credentials must
//	                         not send healthy events to the DLQ
//
// Transient failures of OutageThreshold distinct events in a row, with no
// success between them, are an outage and are treated as Systemic too.
//
// Every retry bills the same event again, so the payment call carries the
// same Idempotency-Key and body.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/sethvargo/go-retry"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// Biller bills one validated event; *billing.Service is one.
type Biller interface {
	Process(ctx context.Context, ev events.OrderConfirmed) (billing.Result, error)
}

// DeadLetterer durably writes a record to the dead-letter topic;
// *dlq.Writer is one.
type DeadLetterer interface {
	Send(ctx context.Context, msg kafka.Message, reason dlq.Reason, cause error, attempts int) error
}

// Config configures a Handler. Every field is required, except Tracer and
// Propagator.
type Config struct {
	Biller  Biller
	DLQ     DeadLetterer
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	Now     func() time.Time
	// MaxAttempts is how many times a transiently failing event is tried
	// before it is dead-lettered as "exhausted".
	MaxAttempts int
	// OutageThreshold is how many distinct events must fail transiently in
	// a row, with no success in between, before the failures are taken as
	// an outage of a dependency (the provider unreachable or answering 5xx
	// to everything): from then on transient failures wait like systemic
	// ones, spending no attempts, instead of draining healthy events into
	// the DLQ. Zero disables the detection.
	OutageThreshold int
	// BackoffBase and BackoffMax shape the delay between attempts:
	// exponential from BackoffBase, capped at BackoffMax, ±20% jitter.
	BackoffBase, BackoffMax time.Duration
	// Tracer starts the "billing.process" span of each record; nil means
	// a no-op tracer, which records nothing but still hands an incoming
	// trace context on to the payment call.
	Tracer trace.Tracer
	// Propagator reads the trace context from the record's headers; nil
	// means W3C trace context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// Handler processes records. It is safe for concurrent use.
type Handler struct {
	cfg Config
	// stalled counts handlers waiting out a systemic failure.
	stalled atomic.Int64
	// failing holds the events that failed transiently since the last
	// success; failingN mirrors its size for a lock-free check.
	mu       sync.Mutex
	failing  map[uuid.UUID]struct{}
	failingN atomic.Int64
}

// New returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Biller == nil || cfg.DLQ == nil || cfg.Metrics == nil || cfg.Logger == nil || cfg.Now == nil {
		return nil, errors.New("pipeline: biller, dlq, metrics, logger and clock are required")
	}
	if cfg.MaxAttempts < 1 || cfg.BackoffBase <= 0 || cfg.BackoffMax < cfg.BackoffBase {
		return nil, fmt.Errorf("pipeline: invalid retry policy: %d attempts, backoff %v..%v", cfg.MaxAttempts, cfg.BackoffBase, cfg.BackoffMax)
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer(tracing.ScopeName)
	}
	if cfg.Propagator == nil {
		cfg.Propagator = tracing.Propagator()
	}
	return &Handler{cfg: cfg, failing: map[uuid.UUID]struct{}{}}, nil
}

// Stalled reports whether some event is waiting out a systemic failure
// (database unreachable, provider credentials rejected): the service is
// then not ready.
func (h *Handler) Stalled() bool { return h.stalled.Load() > 0 }

// Handle processes msg until it has an outcome that may be committed, and
// returns nil; or returns ctx's error when ctx ends first, leaving msg
// uncommitted for redelivery.
//
// The whole of it is one consumer span, a child of the record's
// traceparent when it has one; the payment calls are its children.
func (h *Handler) Handle(ctx context.Context, msg kafka.Message) error {
	ctx, span := h.startSpan(ctx, msg)
	defer span.End()
	err := h.handle(ctx, msg)
	if err != nil {
		span.SetStatus(codes.Error, "abandoned, left for redelivery: "+err.Error())
	}
	return err
}

func (h *Handler) handle(ctx context.Context, msg kafka.Message) error {
	ev, err := events.Decode(msg.Value, h.cfg.Now())
	if err != nil {
		return h.deadLetter(ctx, msg, nil, dlq.Invalid, err, 1)
	}
	spanEvent(ctx, ev)
	// Transient retries and systemic waits back off separately: a long
	// outage must not leave the event's next transient retry at the cap.
	transient, systemic := h.backoff(), h.backoff()
	// The event counts as stalled from its first systemic failure until it
	// has any other outcome, attempts in between included, so /readyz does
	// not flicker to ready while the failing call is under way.
	stalled := false
	defer func() {
		if stalled {
			h.stalled.Add(-1)
		}
	}()
	for attempt := 1; ; attempt++ {
		res, err := h.cfg.Biller.Process(ctx, ev)
		kind := fault.KindOf(err)
		if err != nil && kind == fault.Transient && ctx.Err() == nil && h.outage(ev) {
			kind = fault.Systemic
			err = fmt.Errorf("dependency outage (%d events failing in a row): %w", h.failingN.Load(), err)
		} else if err == nil || kind != fault.Transient {
			h.recovered()
		}
		if stalled && kind != fault.Systemic {
			stalled = false
			h.stalled.Add(-1)
			systemic = h.backoff()
			h.cfg.Logger.InfoContext(ctx, "systemic failure over, event resumed", "event_id", ev.EventID)
		}
		if err == nil {
			spanOutcome(ctx, string(res.Outcome), attempt)
			h.cfg.Metrics.Events.WithLabelValues(string(res.Outcome)).Inc()
			if res.DedupBypassed {
				h.cfg.Metrics.DedupBypassed.Inc()
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch kind {
		case fault.Invalid:
			return h.deadLetter(ctx, msg, &ev, dlq.Invalid, err, attempt)
		case fault.Permanent:
			return h.deadLetter(ctx, msg, &ev, dlq.Permanent, err, attempt)
		case fault.Conflict:
			return h.deadLetter(ctx, msg, &ev, dlq.Conflict, err, attempt)
		case fault.Systemic:
			// Not the event's fault: wait it out, however long, without
			// spending the event's attempts.
			attempt--
			if !stalled {
				stalled = true
				h.stalled.Add(1)
			}
			h.cfg.Metrics.Retries.WithLabelValues(fault.Systemic.String()).Inc()
			spanRetry(ctx, fault.Systemic)
			h.cfg.Logger.ErrorContext(ctx, "systemic failure, pausing this event", "event_id", ev.EventID, "err", err)
			if err := sleep(ctx, systemic); err != nil {
				return err
			}
			continue
		}
		if attempt >= h.cfg.MaxAttempts {
			return h.deadLetter(ctx, msg, &ev, dlq.Exhausted, err, attempt)
		}
		h.cfg.Metrics.Retries.WithLabelValues(kind.String()).Inc()
		spanRetry(ctx, kind)
		h.cfg.Logger.WarnContext(ctx, "event failed, retrying", "event_id", ev.EventID, "order_id", ev.OrderID,
			"attempt", attempt, "err", err)
		if err := sleep(ctx, transient); err != nil {
			return err
		}
	}
}

// outage records ev's transient failure and reports whether enough
// distinct events have failed in a row to call it an outage.
func (h *Handler) outage(ev events.OrderConfirmed) bool {
	if h.cfg.OutageThreshold <= 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failing[ev.EventID] = struct{}{}
	h.failingN.Store(int64(len(h.failing)))
	return len(h.failing) >= h.cfg.OutageThreshold
}

// recovered ends a failure streak: something got an answer.
func (h *Handler) recovered() {
	if h.failingN.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.failing)
	h.failingN.Store(0)
}

// deadLetter writes msg to the DLQ, retrying until it is acknowledged or
// ctx ends: the offset must not move past a record that is neither billed
// nor dead-lettered.
func (h *Handler) deadLetter(ctx context.Context, msg kafka.Message, ev *events.OrderConfirmed, reason dlq.Reason, cause error, attempts int) error {
	b := h.backoff()
	for {
		err := h.cfg.DLQ.Send(ctx, msg, reason, cause, attempts)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		h.cfg.Logger.ErrorContext(ctx, "dead-letter write failed, retrying", "partition", msg.Partition, "offset", msg.Offset, "err", err)
		if err := sleep(ctx, b); err != nil {
			return err
		}
	}
	spanDeadLettered(ctx, reason, attempts)
	h.cfg.Metrics.Events.WithLabelValues("dlq").Inc()
	h.cfg.Metrics.DLQ.WithLabelValues(string(reason)).Inc()
	attrs := []any{"reason", reason, "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset,
		"attempts", attempts, "err", cause}
	if ev != nil {
		attrs = append(attrs, "event_id", ev.EventID, "order_id", ev.OrderID)
	}
	h.cfg.Logger.WarnContext(ctx, "record dead-lettered", attrs...)
	return nil
}

func (h *Handler) backoff() retry.Backoff {
	return retry.WithJitterPercent(20, retry.WithCappedDuration(h.cfg.BackoffMax, retry.NewExponential(h.cfg.BackoffBase)))
}

func sleep(ctx context.Context, b retry.Backoff) error {
	d, _ := b.Next()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
