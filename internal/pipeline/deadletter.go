package pipeline

import (
	"context"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
)

// Dead letters. A valid event's dead letter is its decision (SPEC §11 I2:
// its dead letters all carry one reason): writeDLQ records it (Decisions)
// before the record is written, and a later delivery of the record is
// answered by the Biller with the stored decision (billing.DeadLettered),
// which is written again, nothing sent. Only `dlq replay` (a higher
// dlq-replay-count) decides the event afresh. An invalid record has no
// event and no decision: it is dead-lettered as before.

// Decisions keeps the dead-letter decisions of valid events (SPEC §11
// I2: one reason); *billing.Service is one. RecordDeadLetter stores the
// decision (reason, cause) of ev's record carrying dlq-replay-count
// replayCount, unless the event was dead-lettered before for a record
// replayed as often or more, and returns the reason and cause to write:
// the stored ones.
type Decisions interface {
	RecordDeadLetter(ctx context.Context, ev events.OrderConfirmed, replayCount int, reason, cause string) (string, string, error)
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
// event's record was counted when it was deferred. A valid event's
// decision is recorded first (decision), unless cause is that decision
// (billing.DeadLettered): the dead letter carries the reason stored.
func (h *Handler) writeDLQ(ctx context.Context, msg kafka.Message, ev *events.OrderConfirmed, reason dlq.Reason, cause error, attempts int) error {
	if _, stored := billing.AsDeadLettered(cause); ev != nil && !stored {
		stored, err := h.decision(ctx, msg, *ev, reason, cause)
		if err != nil {
			return err
		}
		if stored != nil {
			reason, cause = dlq.Reason(stored.Reason), stored
		}
	}
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

// decision records ev's dead letter (reason, cause) for msg before it is
// written, retrying until it is stored or ctx ends (then ctx's error: the
// record stays uncommitted). It returns the decision stored before, when
// the event was dead-lettered already for a record replayed as often
// (SPEC §11 I2: that reason is written again), else nil.
func (h *Handler) decision(ctx context.Context, msg kafka.Message, ev events.OrderConfirmed, reason dlq.Reason, cause error) (*billing.DeadLettered, error) {
	b := h.backoff()
	for {
		r, c, err := h.cfg.Decisions.RecordDeadLetter(ctx, ev, dlq.ReplayCount(msg), string(reason), cause.Error())
		if err == nil {
			if r == string(reason) && c == cause.Error() {
				return nil, nil
			}
			h.cfg.Logger.WarnContext(ctx, "event dead-lettered before: its dead letter keeps the reason decided then",
				"event_id", ev.EventID, "order_id", ev.OrderID, "reason", r, "this_delivery", reason, "err", cause)
			return &billing.DeadLettered{Reason: r, Cause: c}, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		h.cfg.Logger.ErrorContext(ctx, "recording the dead-letter decision failed, retrying", "event_id", ev.EventID, "err", err)
		if err := sleep(ctx, b); err != nil {
			return nil, err
		}
	}
}
