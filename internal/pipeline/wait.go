package pipeline

import (
	"context"
	"time"

	"github.com/sethvargo/go-retry"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// waits is one event's backoffs and whether it counts as stalled. A nil
// backoff is a fresh one, built by lazy on its first wait: most events
// never wait, and three backoffs are six allocations.
type waits struct {
	transient, systemic, busy retry.Backoff
	stalled                   bool
	// waited is how long the event has waited on another's claim.
	waited waited
}

// wait sleeps out a systemic failure or an outage (stall: marking the
// event stalled, so the service is unready) or a busy order (the event
// stays ready: the service is healthy, one order is waiting for its claim
// to settle).
func (h *Handler) wait(ctx context.Context, ev events.OrderConfirmed, stall bool, err error, w *waits) error {
	kind := fault.Systemic
	if !stall {
		kind = fault.Busy
	}
	h.cfg.Metrics.Retries.WithLabelValues(kind.String()).Inc()
	spanRetry(ctx, kind)
	if !stall {
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
