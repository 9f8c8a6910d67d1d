// Package pipeline turns one Kafka record into a finished outcome: decode
// and validate it, bill it with retries, or dead-letter it. Its Handle is
// the consumer's handler: it returns nil only when the record may be
// committed.
//
// What happens to a failure is internal/policy's Decide, from its
// fault.Kind and the event's budget: dead-lettered for the event's own
// definite faults (invalid, permanent, conflict), retried with capped
// exponential backoff and jitter while transient, parked (its claim handed
// to the completer, its record committed) once it has failed for
// ParkAfter, dead-lettered "exhausted" once it has failed for RetryBudget
// (and MaxAttempts times) if it could not be parked; a systemic failure
// (a database outage, rejected credentials) waits without limit, marked
// unready; a busy order (another event holds its claim) waits, still
// ready, and is deferred (its record stored for a decision once that
// claim settles, and committed) once it has waited for ParkAfter, or at
// once when the claim is blocked (billing.ErrHeld). Handle gathers the
// facts and carries the action out.
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
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/field"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/policy"
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
	Biller Biller
	DLQ    DeadLetterer
	// Decisions records a valid event's dead-letter decision before its
	// dead letter is written (writeDLQ): a redelivery of the record is
	// then answered by Biller with it (billing.DeadLettered) and
	// dead-lettered again with the same reason; only a `dlq replay`
	// decides the event afresh.
	Decisions Decisions
	Metrics   *metrics.Metrics
	Logger    *slog.Logger
	Now       func() time.Time
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
	// stored by Deferrer for a later decision (DecideDeferred), and
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
	cfg    Config
	policy policy.Config
	// stalled counts handlers waiting out a systemic failure.
	stalled atomic.Int64
	streak  streak
}

// New returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Biller == nil || cfg.DLQ == nil || cfg.Decisions == nil || cfg.Metrics == nil || cfg.Logger == nil || cfg.Now == nil {
		return nil, errors.New("pipeline: biller, dlq, decisions, metrics, logger and clock are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	if cfg.ParkAfter > 0 && (cfg.Parker == nil || cfg.Deferrer == nil) {
		return nil, fmt.Errorf("pipeline: parking after %v needs a parker and a deferrer", cfg.ParkAfter)
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer(tracing.ScopeName)
	}
	if cfg.Propagator == nil {
		cfg.Propagator = tracing.Propagator()
	}
	pol := policy.Config{MaxAttempts: cfg.MaxAttempts, RetryBudget: cfg.RetryBudget, ParkAfter: cfg.ParkAfter}
	return &Handler{cfg: cfg, policy: pol, streak: streak{failing: map[uuid.UUID]struct{}{}}}, nil
}

// Validate returns nil when the retry settings of cfg are usable, or the
// errors.Join of a *field.Error for each field that is not: those of the
// failure policy (policy.Config.Validate: MaxAttempts, RetryBudget,
// ParkAfter), the outage detection (OutageAfter and OutageThreshold, zero
// or more) and the backoff (BackoffBase positive, BackoffMax at least
// BackoffBase). New checks it; the dependencies it checks itself.
func (cfg Config) Validate() error {
	var errs []error
	pol := policy.Config{MaxAttempts: cfg.MaxAttempts, RetryBudget: cfg.RetryBudget, ParkAfter: cfg.ParkAfter}
	if err, ok := pol.Validate().(interface{ Unwrap() []error }); ok {
		for _, e := range err.Unwrap() {
			var pe *policy.Error
			if errors.As(e, &pe) {
				e = field.Errorf(pe.Field, "%v", pe.Err)
			}
			errs = append(errs, e)
		}
	}
	if cfg.OutageThreshold < 0 {
		errs = append(errs, field.Errorf("OutageThreshold", "must be 0 (off) or more, got %d", cfg.OutageThreshold))
	}
	if cfg.OutageAfter < 0 {
		errs = append(errs, field.Errorf("OutageAfter", "must be 0s (off) or more, got %s", cfg.OutageAfter))
	}
	if cfg.BackoffBase <= 0 {
		errs = append(errs, field.Errorf("BackoffBase", "must be positive, got %s", cfg.BackoffBase))
	} else if cfg.BackoffMax < cfg.BackoffBase {
		errs = append(errs, field.Errorf("BackoffMax", "must be at least %s (%s), got %s", field.Ref("BackoffBase"), cfg.BackoffBase, cfg.BackoffMax))
	}
	return errors.Join(errs...)
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

// handle is Handle without the span: it asks the failure policy what to
// do with each failed attempt (policy.Decide) and carries the action out.
func (h *Handler) handle(ctx context.Context, msg kafka.Message) error {
	// Every try below is one attempt at the charge: a definite refusal
	// after an earlier try's unknown outcome may still release the claim
	// this delivery made (SPEC §6). It decides a record replayed as often
	// as its dlq-replay-count says: a dead letter decided before for it is
	// written again, and only a replay decides it afresh (SPEC §11 I2).
	ctx = billing.WithAttempt(billing.WithReplayCount(ctx, dlq.ReplayCount(msg)))
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
		now := h.cfg.Now()
		if err == nil {
			h.recovered()
			h.unstall(ctx, ev, w)
			spanOutcome(ctx, string(res.Outcome), b.attempts+1)
			h.cfg.Metrics.Events.WithLabelValues(string(res.Outcome)).Inc()
			if res.DedupBypassed {
				h.cfg.Metrics.DedupBypassed.Inc()
			}
			return nil
		}
		if d, ok := billing.AsDeadLettered(err); ok {
			// Decided before: the same dead letter again, nothing sent.
			h.unstall(ctx, ev, w)
			return h.deadLetter(ctx, msg, &ev, dlq.Reason(d.Reason), err, b.attempts+1)
		}
		f, err := h.failure(ctx, ev, err, b, w, now)
		a := policy.Decide(h.policy, f)
		if a.Spends() {
			b.fail(now)
		} else {
			b.pause()
		}
		// A Park or a Defer that did not happen is decided again, as an
		// action that spends as the first did (policy.Action.Spends).
		for done := false; a == policy.Park || a == policy.Defer; a = policy.Decide(h.policy, f) {
			if a == policy.Park {
				done, f.ParkFailed = h.park(ctx, msg, ev, b, err), true
			} else {
				done, f.DeferFailed = h.deferEvent(ctx, msg, ev, f.Waited, err), true
			}
			if done {
				return nil
			}
		}
		switch a {
		case policy.Leave:
			return ctx.Err()
		case policy.Wait, policy.Stall:
			err = h.wait(ctx, ev, a == policy.Stall, err, w)
		case policy.Retry:
			h.cfg.Metrics.Retries.WithLabelValues(f.Kind.String()).Inc()
			spanRetry(ctx, f.Kind)
			h.cfg.Logger.WarnContext(ctx, "event failed, retrying", "event_id", ev.EventID, "order_id", ev.OrderID,
				"attempt", b.attempts, "failing_for", b.spent, "err", err)
			err = sleepFor(ctx, h.untilParked(h.lazy(&w.transient), b))
		default:
			return h.deadLetter(ctx, msg, &ev, a.Reason(), err, f.Attempts+1)
		}
		if err != nil {
			return err
		}
	}
}

// failure gathers the facts of ev's failed attempt err at now for the
// failure policy, and keeps the handler's books on it: a transient failure
// extends the failure streak, which may declare an outage (then err is
// wrapped to say so); a definite answer ends the streak; any answer but a
// systemic failure ends ev's stalled mark; a busy answer extends ev's wait
// on the other claim, any other ends it.
func (h *Handler) failure(ctx context.Context, ev events.OrderConfirmed, err error, b budget, w *waits, now time.Time) (policy.Failure, error) {
	kind := fault.KindOf(err)
	f := policy.Failure{By: policy.Handler, Kind: kind, Canceled: ctx.Err() != nil, Held: errors.Is(err, billing.ErrHeld),
		Attempts: b.attempts, Spent: b.spent, SinceCounted: b.since(now)}
	if kind == fault.Transient && !f.Canceled {
		if outage := h.outage(ev, now, b.attempts == 0); outage != "" {
			f.Outage = true
			err = fmt.Errorf("dependency outage (%s): %w", outage, err)
		}
	} else if answered(err, kind) {
		h.recovered()
	}
	if kind != fault.Systemic && !f.Outage {
		h.unstall(ctx, ev, w)
	}
	f.Waited = w.waited.observe(kind, now)
	return f, err
}

// unstall ends ev's stalled mark, if it has one: it has had an answer
// other than a systemic failure. The event counts as stalled from its
// first systemic failure until then, attempts in between included, so
// /readyz does not flicker to ready while the failing call is under way.
func (h *Handler) unstall(ctx context.Context, ev events.OrderConfirmed, w *waits) {
	if !w.stalled {
		return
	}
	w.stalled = false
	h.stalled.Add(-1)
	w.systemic = nil
	h.cfg.Logger.InfoContext(ctx, "systemic failure over, event resumed", "event_id", ev.EventID)
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

// answered reports whether err (of kind) is a definite answer of the
// billing path's dependencies: a success, or a refusal that is the
// event's own. It ends a failure streak; systemic and busy answers do not.
func answered(err error, kind fault.Kind) bool {
	return err == nil || kind == fault.Invalid || kind == fault.Permanent || kind == fault.Conflict
}
