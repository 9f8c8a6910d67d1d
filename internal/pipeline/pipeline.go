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

	"github.com/segmentio/kafka-go"
	"github.com/sethvargo/go-retry"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
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

// Config configures a Handler. Every field is required.
type Config struct {
	Biller  Biller
	DLQ     DeadLetterer
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	Now     func() time.Time
	// MaxAttempts is how many times a transiently failing event is tried
	// before it is dead-lettered as "exhausted".
	MaxAttempts int
	// BackoffBase and BackoffMax shape the delay between attempts:
	// exponential from BackoffBase, capped at BackoffMax, ±20% jitter.
	BackoffBase, BackoffMax time.Duration
}

// Handler processes records. It is safe for concurrent use.
type Handler struct {
	cfg Config
	// stalled counts handlers waiting out a systemic failure.
	stalled atomic.Int64
}

// New returns a Handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Biller == nil || cfg.DLQ == nil || cfg.Metrics == nil || cfg.Logger == nil || cfg.Now == nil {
		return nil, errors.New("pipeline: biller, dlq, metrics, logger and clock are required")
	}
	if cfg.MaxAttempts < 1 || cfg.BackoffBase <= 0 || cfg.BackoffMax < cfg.BackoffBase {
		return nil, fmt.Errorf("pipeline: invalid retry policy: %d attempts, backoff %v..%v", cfg.MaxAttempts, cfg.BackoffBase, cfg.BackoffMax)
	}
	return &Handler{cfg: cfg}, nil
}

// Stalled reports whether some event is waiting out a systemic failure
// (database unreachable, provider credentials rejected): the service is
// then not ready.
func (h *Handler) Stalled() bool { return h.stalled.Load() > 0 }

// Handle processes msg until it has an outcome that may be committed, and
// returns nil; or returns ctx's error when ctx ends first, leaving msg
// uncommitted for redelivery.
func (h *Handler) Handle(ctx context.Context, msg kafka.Message) error {
	ev, err := events.Decode(msg.Value, h.cfg.Now())
	if err != nil {
		return h.deadLetter(ctx, msg, nil, dlq.Invalid, err, 1)
	}
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
		if stalled && fault.KindOf(err) != fault.Systemic {
			stalled = false
			h.stalled.Add(-1)
			systemic = h.backoff()
		}
		if err == nil {
			h.cfg.Metrics.Events.WithLabelValues(string(res.Outcome)).Inc()
			if res.DedupBypassed {
				h.cfg.Metrics.DedupBypassed.Inc()
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		kind := fault.KindOf(err)
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
			h.cfg.Logger.Error("systemic failure, pausing this event", "event_id", ev.EventID, "err", err)
			if err := sleep(ctx, systemic); err != nil {
				return err
			}
			continue
		}
		if attempt >= h.cfg.MaxAttempts {
			return h.deadLetter(ctx, msg, &ev, dlq.Exhausted, err, attempt)
		}
		h.cfg.Metrics.Retries.WithLabelValues(kind.String()).Inc()
		h.cfg.Logger.Warn("event failed, retrying", "event_id", ev.EventID, "order_id", ev.OrderID,
			"attempt", attempt, "err", err)
		if err := sleep(ctx, transient); err != nil {
			return err
		}
	}
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
		h.cfg.Logger.Error("dead-letter write failed, retrying", "partition", msg.Partition, "offset", msg.Offset, "err", err)
		if err := sleep(ctx, b); err != nil {
			return err
		}
	}
	h.cfg.Metrics.Events.WithLabelValues("dlq").Inc()
	h.cfg.Metrics.DLQ.WithLabelValues(string(reason)).Inc()
	attrs := []any{"reason", reason, "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset,
		"attempts", attempts, "err", cause}
	if ev != nil {
		attrs = append(attrs, "event_id", ev.EventID, "order_id", ev.OrderID)
	}
	h.cfg.Logger.Warn("record dead-lettered", attrs...)
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
