package pipeline

import (
	"context"
	"errors"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
)

// An operator's pause (SPEC §11 I4; Config.Gate, fed by pause.Watcher)
// stops the pipeline's sends: the consumer hands out no new record, the
// handler waits for the resume before each Process call of a record it
// already holds, retries included, and the deciding loop before each
// decision. A request in flight when the pause comes finishes. Waiting
// for the resume is an operator's decision, not a failure: it spends
// neither attempts nor retry budget, ends a failure streak (nothing is
// sent, so the time paused says nothing about the provider), and does not
// mark the service stalled (unready). The Biller checks the pause again
// where its requests leave and answers billing.ErrPaused when the pause
// came after the handler's check: nothing was sent, and the handler waits
// for the resume as well.

// pausedGate returns the Gate's channel while billing is paused, nil when
// it may send (or without a Gate).
func (h *Handler) pausedGate() <-chan struct{} {
	if h.cfg.Gate == nil {
		return nil
	}
	g := h.cfg.Gate()
	select {
	case <-g:
		return nil
	default:
		return g
	}
}

// paused reports whether an operator's pause is in force.
func (h *Handler) paused() bool { return h.pausedGate() != nil }

// processResumed calls the Biller once billing is not paused (awaitResume),
// and again while it answers billing.ErrPaused: nothing was sent. An
// ended ctx is its error.
func (h *Handler) processResumed(ctx context.Context, ev events.OrderConfirmed, b *budget, w *waits) (billing.Result, error) {
	for {
		if err := h.awaitResume(ctx, ev, b, w); err != nil {
			return billing.Result{}, err
		}
		res, err := h.cfg.Biller.Process(ctx, ev)
		if !errors.Is(err, billing.ErrPaused) || ctx.Err() != nil {
			return res, err
		}
		if !h.paused() { // the Biller's view of the pause is ahead of the Gate's: not a busy loop
			if err := sleepFor(ctx, h.cfg.BackoffBase); err != nil {
				return billing.Result{}, err
			}
		}
	}
}

// awaitResume returns at once when billing is not paused; otherwise it
// stops ev's budget clock, gives up its stalled mark and the handler's
// failure streak, and waits until the pause ends (nil) or ctx does (its
// error).
func (h *Handler) awaitResume(ctx context.Context, ev events.OrderConfirmed, b *budget, w *waits) error {
	g := h.pausedGate()
	if g == nil {
		return nil
	}
	b.pause()
	if w.stalled {
		w.stalled = false
		h.stalled.Add(-1)
	}
	h.recovered()
	h.cfg.Logger.InfoContext(ctx, "billing paused by an operator: the event waits for the resume", "event_id", ev.EventID, "order_id", ev.OrderID)
	for ; g != nil; g = h.pausedGate() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-g:
		}
	}
	h.cfg.Logger.InfoContext(ctx, "billing resumed: the event goes on", "event_id", ev.EventID, "order_id", ev.OrderID)
	return nil
}
