package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/policy"
)

// Deferrer keeps the events whose decision waits on another event's claim
// (SPEC §10) and hands them back once that claim is no longer pending;
// *billing.Service is one (billing/deferred.go says how it is stored).
type Deferrer interface {
	Defer(ctx context.Context, ev events.OrderConfirmed, rec billing.Record) (bool, error)
	TakeDeferred(ctx context.Context, lease time.Duration) (billing.Deferred, bool, error)
	FinishDeferred(ctx context.Context, d billing.Deferred) error
	RetryDeferred(ctx context.Context, d billing.Deferred, after time.Duration, cause error) error
}

const (
	// deferredLease is how long a replica deciding a deferred event keeps
	// it from the others; a decision (one Process call and perhaps a
	// dead-letter write) is bounded by deferredDecideTimeout, well inside.
	deferredLease         = time.Minute
	deferredDecideTimeout = 30 * time.Second
	// deferredBatch is the most deferred events one pass decides.
	deferredBatch = 100
	// deferredRetryMax caps the backoff of a deferred event whose own
	// charge stays unknown, as the parked claims' re-sends are capped.
	deferredRetryMax = 10 * time.Second
)

// waited tracks how long an event has waited, in a row, on another
// event's claim: the deferral's clock. Any other answer resets it.
type waited struct{ since time.Time }

func (w *waited) observe(kind fault.Kind, now time.Time) time.Duration {
	if kind != fault.Busy {
		w.since = time.Time{}
		return 0
	}
	if w.since.IsZero() {
		w.since = now
	}
	return now.Sub(w.since)
}

// deferEvent stores ev for a later decision (Deferrer) after it has waited
// on another event's claim for ParkAfter, or at once when it is held
// behind a blocked claim (billing.ErrHeld), and reports whether it did:
// then msg may be committed, counted "parked". A redelivery of a record
// deferred before is stored already: committed as deferred again. When
// the claim settled meanwhile, or the store failed, ev goes on waiting
// and is processed again, which decides it.
func (h *Handler) deferEvent(ctx context.Context, msg kafka.Message, ev events.OrderConfirmed, waitedFor time.Duration, cause error) bool {
	stored, err := h.cfg.Deferrer.Defer(ctx, ev, recordOf(msg))
	if err != nil || !stored {
		if err != nil {
			h.cfg.Logger.WarnContext(ctx, "could not defer the event, waiting on", "event_id", ev.EventID, "order_id", ev.OrderID, "err", err)
		}
		return false
	}
	spanOutcome(ctx, "deferred", 0)
	h.cfg.Metrics.Events.WithLabelValues("parked").Inc()
	h.cfg.Logger.WarnContext(ctx, "event deferred: its decision waits for the claim on its order, its record committed",
		"event_id", ev.EventID, "order_id", ev.OrderID, "waited", waitedFor, "held", errors.Is(cause, billing.ErrHeld), "err", cause)
	return true
}

// DecideDeferred makes one pass of the deferred decisions' loop (every
// replica runs it, each second; a lease keeps two from deciding one event
// at once): it takes up the deferred events whose claim is no longer
// pending, due, one at a time (each lease covers one decision), up to
// deferredBatch, and decides each. Before each it checks an operator's pause (Config.Gate),
// and a pause ends the pass: each decision may charge (SPEC §11 I4). Its
// error is the pass's (the database, a systemic answer); an event that
// could not be decided yet is given back, not an error.
func (h *Handler) DecideDeferred(ctx context.Context) error {
	if h.cfg.Deferrer == nil {
		return nil // nothing is ever deferred
	}
	for range deferredBatch {
		if h.paused() {
			return nil
		}
		d, ok, err := h.cfg.Deferrer.TakeDeferred(ctx, deferredLease)
		if err != nil || !ok {
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, deferredDecideTimeout)
		err = h.decide(dctx, d)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// decide decides one deferred event as its redelivery would be decided:
// Process bills it (its own attempt: a claim it creates it may release on
// a definite refusal), and its outcome is made durable before the row is
// deleted — by Process for a charge or a duplicate, by an acknowledged
// dead-letter record, with the stored key, value and headers, for a
// conflict or a refusal. A failure is the failure policy's (policy.Decide,
// asked as its Decider): an unknown outcome gives the row back, backing
// off as a parked claim's re-sends do, and so does a held answer
// (billing.ErrHeld: the claim was blocked after the row was taken): the
// event is not decided yet, an operator decides the claim first, and it
// is never a conflict. What the decision does to the row is the deferred
// event's transition function's (billing.DeferredState.Next).
func (h *Handler) decide(ctx context.Context, d billing.Deferred) error {
	msg := messageOf(d.Record)
	ev, err := events.Decode(msg.Value, h.cfg.Now())
	var res billing.Result
	if err == nil {
		res, err = h.cfg.Biller.Process(billing.WithAttempt(billing.WithReplayCount(ctx, dlq.ReplayCount(msg))), ev)
	}
	result, decision, stop := string(res.Outcome), billing.DecisionDurable, false
	if err != nil {
		a := policy.Decide(h.policy, policy.Failure{By: policy.Decider, Kind: fault.KindOf(err), Canceled: ctx.Err() != nil,
			Held: errors.Is(err, billing.ErrHeld), Paused: errors.Is(err, billing.ErrPaused), Attempts: d.Attempts})
		reason := a.Reason()
		if stored, ok := billing.AsDeadLettered(err); ok {
			reason = dlq.Reason(stored.Reason) // decided before: the same dead letter
		}
		switch {
		case reason != "":
			result = "dlq"
			if h.writeDLQ(ctx, msg, &ev, reason, err, d.Attempts) != nil {
				decision = billing.DecisionLeave // not acknowledged before the timeout
			}
		case a == policy.Leave:
			decision = billing.DecisionLeave
		case a == policy.GiveBackUnsent:
			decision = billing.DecisionGiveBackUnsent
		case a == policy.GiveBack, a == policy.GiveBackAndStop:
			decision = billing.DecisionGiveBack
		}
		stop = a == policy.GiveBackAndStop && reason == ""
	}
	_, effects := billing.DeferredLeased.Next(billing.DeferredInput{Step: billing.StepDecided, Decision: decision})
	for _, e := range effects {
		switch e {
		case billing.DeferredRetryNow:
			// Nothing sent: given back at once, and the pass ends (DecideDeferred
			// sees the pause).
			return h.cfg.Deferrer.RetryDeferred(ctx, d, 0, err)
		case billing.DeferredRetry:
			return h.giveBack(ctx, d, err, stop)
		case billing.DeferredFinish:
			if err := h.cfg.Deferrer.FinishDeferred(ctx, d); err != nil {
				return err
			}
			h.cfg.Metrics.DeferredDecided.WithLabelValues(result).Inc()
			h.cfg.Logger.InfoContext(ctx, "deferred event decided", "event_id", d.EventID, "order_id", d.OrderID,
				"result", result, "deferred_for", d.Age, "waited_for", d.WaitsFor)
		}
	}
	return nil // DecisionLeave: the lease ends, and the event is decided again
}

// giveBack gives d back after its failure cause, to be decided again
// after its backoff, and returns the error that ends the pass: cause when
// stop (a systemic failure), else nil.
func (h *Handler) giveBack(ctx context.Context, d billing.Deferred, cause error, stop bool) error {
	after := retryAfter(d.Attempts)
	if err := h.cfg.Deferrer.RetryDeferred(ctx, d, after, cause); err != nil {
		return err
	}
	h.cfg.Logger.InfoContext(ctx, "deferred event not decided yet", "event_id", d.EventID, "order_id", d.OrderID,
		"attempts", d.Attempts, "retry_in", after, "err", cause)
	if stop {
		return cause
	}
	return nil
}

// retryAfter is the delay before a deferred event's attempt-th retry:
// from a second, doubling, capped at deferredRetryMax.
func retryAfter(attempt int) time.Duration {
	return min(time.Second<<min(max(attempt-1, 0), 16), deferredRetryMax)
}

// recordOf and messageOf convert between a Kafka record and billing's
// copy of it.
func recordOf(m kafka.Message) billing.Record {
	r := billing.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Time: m.Time}
	for _, hd := range m.Headers {
		r.Headers = append(r.Headers, billing.Header{Key: hd.Key, Value: hd.Value})
	}
	return r
}

func messageOf(r billing.Record) kafka.Message {
	m := kafka.Message{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Time: r.Time}
	for _, hd := range r.Headers {
		m.Headers = append(m.Headers, kafka.Header{Key: hd.Key, Value: hd.Value})
	}
	return m
}
