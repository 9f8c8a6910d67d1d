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
//	                         jitter; parked (its claim handed to the
//	                         completer, its record committed) once it has
//	                         failed for ParkAfter; DLQ "exhausted" once it
//	                         has failed for RetryBudget (and MaxAttempts
//	                         times), if it could not be parked
//	Systemic               → retry without limit, marked unready: a
//	                         database outage or rejected credentials must
//	                         not send healthy events to the DLQ
//	Busy                   → another event holds the order's claim, its
//	                         outcome unknown: wait with backoff, spending
//	                         nothing, still ready; deferred (its record
//	                         stored for a decision once that claim
//	                         settles, and committed) once it has waited
//	                         for ParkAfter
//	Busy, billing.ErrHeld  → the order's claim (another event's or its
//	                         own) is blocked: deferred at once, since only
//	                         an operator settles it; waits like Busy only
//	                         while it cannot be stored. Never
//	                         dead-lettered (SPEC §11, I3)
//
// A streak of transient failures with no success anywhere in the handler
// is an outage, treated as Systemic, once OutageThreshold distinct events
// have failed in it at their first attempt or it has lasted OutageAfter. So an event exhausts its budget
// only while other events succeed: the fault is then the event's, not the
// provider's.
//
// Every retry bills the same event again, so the payment call carries the
// same Idempotency-Key and body.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Parker hands an event's pending claim to the completer (SPEC §10) and
// keeps rec, the event's record, for the decision the completer cannot
// make (a refusal); *billing.Service is one. Park returns true only when
// the event had a pending claim, now parked with its record stored: its
// record may then be committed.
type Parker interface {
	Park(ctx context.Context, ev events.OrderConfirmed, rec billing.Record) (bool, error)
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
	// MaxAttempts is the least number of transient failures of an event
	// before it may be dead-lettered as "exhausted". With a RetryBudget of
	// minutes the budget decides; MaxAttempts only keeps a short budget
	// from exhausting an event after one or two tries.
	MaxAttempts int
	// RetryBudget is how long the provider must have failed an event
	// before it is dead-lettered as "exhausted": the time from its first
	// transient failure, leaving out the time it spent paused in an outage
	// or waiting for another event's claim (fault.Busy). Zero lets
	// MaxAttempts alone decide. Keep it above OutageAfter, or an event
	// failing alone at low traffic is exhausted before the outage is seen.
	RetryBudget time.Duration
	// OutageThreshold is how many distinct events must fail transiently at
	// their first attempt in a row, with no success in between (retries of
	// events already failing do not count), before the failures are taken as
	// an outage of a dependency (the provider unreachable or answering 5xx
	// to everything): from then on transient failures wait like systemic
	// ones, spending neither attempts nor budget, instead of draining
	// healthy events into the DLQ. Zero disables this count.
	OutageThreshold int
	// OutageAfter is how long a streak of transient failures with no
	// success anywhere may last before it is an outage, however few events
	// it holds: at low traffic one event failing for a minute is more
	// likely the provider's fault than the event's. Zero disables it.
	OutageAfter time.Duration
	// ParkAfter is BILLING_PARK_AFTER: an event that has failed
	// transiently for this long while the provider succeeds for others (the
	// same clock as RetryBudget: outages and busy waits not counted) is
	// parked — its claim handed to the completer by Parker, with its
	// record kept for a later decision, its record committed — so that it
	// holds its partition no longer. Zero never parks; then Parker may be
	// nil. Keep it below RetryBudget. An event that has waited this long
	// on another event's claim (fault.Busy), or at once when it is held
	// behind a blocked claim (billing.ErrHeld), is deferred — its record
	// stored by Deferrer for a later decision (RunDeferred), and
	// committed. Zero never defers either: a held event then waits until
	// an operator's decision settles the claim.
	ParkAfter time.Duration
	Parker    Parker
	Deferrer  Deferrer
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
	// Gate is an operator's pause as the consumer's Gate (closed while
	// billing may send; pause.go); nil means never paused.
	Gate func() <-chan struct{}
}

// Handler processes records. It is safe for concurrent use.
type Handler struct {
	cfg Config
	// stalled counts handlers waiting out a systemic failure.
	stalled atomic.Int64
	streak  streak
}

// New returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Biller == nil || cfg.DLQ == nil || cfg.Metrics == nil || cfg.Logger == nil || cfg.Now == nil {
		return nil, errors.New("pipeline: biller, dlq, metrics, logger and clock are required")
	}
	if cfg.ParkAfter < 0 || cfg.ParkAfter > 0 && (cfg.Parker == nil || cfg.Deferrer == nil) {
		return nil, fmt.Errorf("pipeline: parking after %v needs a parker and a deferrer", cfg.ParkAfter)
	}
	if cfg.MaxAttempts < 1 || cfg.RetryBudget < 0 || cfg.OutageAfter < 0 || cfg.OutageThreshold < 0 ||
		cfg.BackoffBase <= 0 || cfg.BackoffMax < cfg.BackoffBase {
		return nil, fmt.Errorf("pipeline: invalid retry policy: %d attempts, budget %v, outage after %d events or %v, backoff %v..%v",
			cfg.MaxAttempts, cfg.RetryBudget, cfg.OutageThreshold, cfg.OutageAfter, cfg.BackoffBase, cfg.BackoffMax)
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer(tracing.ScopeName)
	}
	if cfg.Propagator == nil {
		cfg.Propagator = tracing.Propagator()
	}
	return &Handler{cfg: cfg, streak: streak{failing: map[uuid.UUID]struct{}{}}}, nil
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
	// Every try below is one attempt at the charge: a definite refusal
	// after an earlier try's unknown outcome may still release the claim
	// this delivery made (SPEC §6).
	ctx = billing.WithAttempt(ctx)
	ev, err := events.Decode(msg.Value, h.cfg.Now())
	if err != nil {
		return h.deadLetter(ctx, msg, nil, dlq.Invalid, err, 1)
	}
	spanEvent(ctx, ev)
	// Transient retries, systemic pauses and busy waits back off
	// separately: a long outage must not leave the event's next transient
	// retry at the cap.
	w := &waits{}
	defer func() {
		if w.stalled {
			h.stalled.Add(-1)
		}
	}()
	var b budget
	for {
		res, err := h.processResumed(ctx, ev, &b, w)
		kind := fault.KindOf(err)
		now := h.cfg.Now()
		if err != nil && kind == fault.Transient && ctx.Err() == nil {
			if outage := h.outage(ev, now, b.attempts == 0); outage != "" {
				kind = fault.Systemic
				err = fmt.Errorf("dependency outage (%s): %w", outage, err)
			}
		} else if answered(err, kind) {
			h.recovered()
		}
		// The event counts as stalled from its first systemic failure until
		// it has any other outcome, attempts in between included, so
		// /readyz does not flicker to ready while the failing call is under
		// way.
		if w.stalled && kind != fault.Systemic {
			w.stalled = false
			h.stalled.Add(-1)
			w.systemic = nil
			h.cfg.Logger.InfoContext(ctx, "systemic failure over, event resumed", "event_id", ev.EventID)
		}
		if err == nil {
			spanOutcome(ctx, string(res.Outcome), b.attempts+1)
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
			return h.deadLetter(ctx, msg, &ev, dlq.Invalid, err, b.attempts+1)
		case fault.Permanent:
			return h.deadLetter(ctx, msg, &ev, dlq.Permanent, err, b.attempts+1)
		case fault.Conflict:
			return h.deadLetter(ctx, msg, &ev, dlq.Conflict, err, b.attempts+1)
		case fault.Systemic, fault.Busy:
			// Not the event's fault: wait it out, however long, spending
			// neither attempts nor budget; an event waiting on another's
			// claim for ParkAfter, or held behind a blocked claim, is
			// deferred instead (deferred.go).
			b.pause()
			if waited := w.waited.observe(kind, now); h.cfg.ParkAfter > 0 && (waited >= h.cfg.ParkAfter || errors.Is(err, billing.ErrHeld)) &&
				h.deferEvent(ctx, msg, ev, waited, err) {
				return nil
			}
			if err := h.wait(ctx, ev, kind, err, w); err != nil {
				return err
			}
			continue
		}
		w.waited.observe(kind, now)
		b.fail(now)
		if h.cfg.ParkAfter > 0 && b.spent >= h.cfg.ParkAfter && h.park(ctx, msg, ev, b, err) {
			return nil
		}
		if b.attempts >= h.cfg.MaxAttempts && b.spent >= h.cfg.RetryBudget {
			return h.deadLetter(ctx, msg, &ev, dlq.Exhausted, err, b.attempts)
		}
		h.cfg.Metrics.Retries.WithLabelValues(kind.String()).Inc()
		spanRetry(ctx, kind)
		h.cfg.Logger.WarnContext(ctx, "event failed, retrying", "event_id", ev.EventID, "order_id", ev.OrderID,
			"attempt", b.attempts, "failing_for", b.spent, "err", err)
		if err := sleepFor(ctx, h.untilParked(h.lazy(&w.transient), b)); err != nil {
			return err
		}
	}
}

// park parks ev's claim (Parker), keeping msg, after its failure err and reports
// whether it did: then ev's record may be committed, and the completer
// owns the claim. Without a pending claim to park, or when parking fails,
// ev goes on retrying as before.
func (h *Handler) park(ctx context.Context, msg kafka.Message, ev events.OrderConfirmed, b budget, err error) bool {
	parked, perr := h.cfg.Parker.Park(ctx, ev, recordOf(msg))
	if perr != nil || !parked {
		if perr != nil {
			h.cfg.Logger.WarnContext(ctx, "could not park the event, retrying it", "event_id", ev.EventID, "order_id", ev.OrderID, "err", perr)
		}
		return false
	}
	spanOutcome(ctx, "parked", b.attempts)
	h.cfg.Metrics.Events.WithLabelValues("parked").Inc()
	h.cfg.Logger.WarnContext(ctx, "event parked: its claim is left to the completer, its record committed",
		"event_id", ev.EventID, "order_id", ev.OrderID, "attempts", b.attempts, "failing_for", b.spent, "err", err)
	return true
}

// waits is one event's backoffs and whether it counts as stalled. A nil
// backoff is a fresh one, built by lazy on its first wait: most events
// never wait, and three backoffs are six allocations.
type waits struct {
	transient, systemic, busy retry.Backoff
	stalled                   bool
	// waited is how long the event has waited on another's claim.
	waited waited
}

// wait sleeps out a systemic failure (marking the event stalled, so the
// service is unready) or a busy order (the event stays ready: the
// service is healthy, one order is waiting for its claim to settle).
func (h *Handler) wait(ctx context.Context, ev events.OrderConfirmed, kind fault.Kind, err error, w *waits) error {
	h.cfg.Metrics.Retries.WithLabelValues(kind.String()).Inc()
	spanRetry(ctx, kind)
	if kind == fault.Busy {
		h.cfg.Logger.InfoContext(ctx, "order claimed by another event, waiting", "event_id", ev.EventID, "order_id", ev.OrderID, "err", err)
		return sleep(ctx, h.lazy(&w.busy))
	}
	if !w.stalled {
		w.stalled = true
		h.stalled.Add(1)
	}
	h.cfg.Logger.ErrorContext(ctx, "systemic failure, pausing this event", "event_id", ev.EventID, "err", err)
	return sleep(ctx, h.lazy(&w.systemic))
}

// answered reports whether err (of kind) is a definite answer of the
// billing path's dependencies: a success, or a refusal that is the
// event's own. It ends a failure streak; systemic and busy answers do not.
func answered(err error, kind fault.Kind) bool {
	return err == nil || kind == fault.Invalid || kind == fault.Permanent || kind == fault.Conflict
}

// deadLetter writes msg to the DLQ, retrying until it is acknowledged or
// ctx ends: the offset must not move past a record that is neither billed
// nor dead-lettered.
func (h *Handler) deadLetter(ctx context.Context, msg kafka.Message, ev *events.OrderConfirmed, reason dlq.Reason, cause error, attempts int) error {
	if err := h.writeDLQ(ctx, msg, ev, reason, cause, attempts); err != nil {
		return err
	}
	h.cfg.Metrics.Events.WithLabelValues("dlq").Inc()
	return nil
}

// writeDLQ is deadLetter without counting the record's outcome: a deferred
// event's record was counted when it was deferred.
func (h *Handler) writeDLQ(ctx context.Context, msg kafka.Message, ev *events.OrderConfirmed, reason dlq.Reason, cause error, attempts int) error {
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
	h.cfg.Metrics.DLQ.WithLabelValues(string(reason)).Inc()
	attrs := []any{"reason", reason, "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset,
		"attempts", attempts, "err", cause}
	if ev != nil {
		attrs = append(attrs, "event_id", ev.EventID, "order_id", ev.OrderID)
	}
	h.cfg.Logger.WarnContext(ctx, "record dead-lettered", attrs...)
	return nil
}

// lazy returns *b, first setting it to a fresh backoff if it is nil.
func (h *Handler) lazy(b *retry.Backoff) retry.Backoff {
	if *b == nil {
		*b = h.backoff()
	}
	return *b
}

func (h *Handler) backoff() retry.Backoff {
	return retry.WithJitterPercent(20, retry.WithCappedDuration(h.cfg.BackoffMax, retry.NewExponential(h.cfg.BackoffBase)))
}

// untilParked is the wait before an event's next transient retry: the
// backoff's next delay, but no later than the moment the event will have
// failed for ParkAfter, so that the attempt which parks it comes then and
// not up to a whole capped backoff (BILLING_RETRY_BACKOFF_MAX) later. Every
// record behind the event in its partition waits for that park to be
// committed.
func (h *Handler) untilParked(backoff retry.Backoff, b budget) time.Duration {
	d, _ := backoff.Next()
	if h.cfg.ParkAfter > 0 && b.spent < h.cfg.ParkAfter {
		d = min(d, h.cfg.ParkAfter-b.spent)
	}
	return d
}

func sleep(ctx context.Context, b retry.Backoff) error {
	d, _ := b.Next()
	return sleepFor(ctx, d)
}

func sleepFor(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
