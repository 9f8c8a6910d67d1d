package billing

import (
	"errors"
	"fmt"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// An operator's pause (SPEC §11 I4, internal/postgres/pause) stops every sender
// before its next request; a request already in flight finishes. Billing's
// senders consult it where their requests leave, so that nothing queued
// or gathered before the pause sends after it:
//
//   - Process and the Batcher (Config.Paused): before the claims, so that
//     a paused service claims nothing it would not send; and again right
//     before the requests, after the claims and the charge transaction's
//     preparation, because a batch may wait for a free slot and a
//     statement may be slow. Caught there, the transaction rolls back
//     (no processed_event row stays) and the claims stay pending, each
//     still the creating attempt's: its retry after the resume sends the
//     same request and may still release the claim on a refusal.
//   - The Completer (Completer.Paused): before each claim of a pass, and
//     again right before the claim's request; the pass stops there.
//
// The pipeline waits for the resume before each Process call, retries
// included, and the deciding loop before each decision (package pipeline).

// ErrPaused is the error of a Process call, or the reason a completer
// pass stopped, when an operator's pause is in force: no request was
// sent. It is fault.Busy — not the event's fault, nothing spent — but
// callers that know it wait for the resume instead.
var ErrPaused = fault.New(fault.Busy, errors.New("billing paused by an operator: nothing sent"))

// paused reports whether Config.Paused says an operator's pause is in
// force.
func (s *Service) paused() bool { return s.pausedFn != nil && s.pausedFn() }

// pausedAll answers every event of batch with ErrPaused.
func pausedAll(batch []events.OrderConfirmed, out []response) []response {
	for i, ev := range batch {
		out[i] = response{err: fmt.Errorf("order %d: %w", ev.OrderID, ErrPaused)}
	}
	return out
}

// pausedAt answers the events evs[idx], about to be sent, with ErrPaused.
func pausedAt(evs []events.OrderConfirmed, idx []int, out []response) {
	for _, i := range idx {
		out[i] = response{err: fmt.Errorf("order %d: %w", evs[i].OrderID, ErrPaused)}
	}
}

// paused reports whether Paused says an operator's pause is in force.
func (c *Completer) paused() bool { return c.Paused != nil && c.Paused() }
