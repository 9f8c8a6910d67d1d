// Package billing is the use case of billing-consumer: one validated
// order.confirmed event in, one outcome out, in one Postgres transaction.
//
// The transaction holds, in this order:
//
//  1. the processed_event insert (ON CONFLICT DO NOTHING): no row means this
//     consumer group already finished the event, outcome Duplicate;
//  2. the charge ledger insert, keyed by order_id: an existing row means the
//     order was already charged, by this event (Duplicate) or by another
//     one (DuplicateOrder when the amount and customer match, a Conflict
//     error when they do not). A concurrent transaction for the same order
//     waits on this insert until the first one ends, so two events for one
//     order never both charge;
//  3. the payment call, with the event_id as Idempotency-Key;
//  4. the provider's charge id written to the ledger row, then COMMIT.
//
// Any failure rolls all of it back, so a retry starts afresh and charges
// with the same key and body: a charge the provider took but whose answer
// was lost is replayed by the provider, not taken twice.
package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/dedup"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
)

// Charger takes one charge at the payment provider. *payment.Client is
// the production implementation. Its errors carry a fault.Kind.
type Charger interface {
	Charge(ctx context.Context, ch payment.Charge) (payment.Result, error)
}

// Beginner starts transactions; *pgxpool.Pool is one.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Outcome is what processing an event did. Its values are the result label
// of billing_events_total.
type Outcome string

// Outcomes of Process.
const (
	// Charged: the order was charged and recorded.
	Charged Outcome = "charged"
	// Duplicate: this event was processed before; nothing was done.
	Duplicate Outcome = "duplicate"
	// DuplicateOrder: another event already charged this order with the
	// same amount; nothing was charged.
	DuplicateOrder Outcome = "duplicate_order"
)

// Result is the outcome of one event.
type Result struct {
	Outcome Outcome
	// ChargeID is the provider's charge id, for Charged.
	ChargeID string
	// DedupBypassed is true when the event's UUIDv7 time fell outside the
	// processed_event partitions and the ledger alone decided (SPEC §6).
	DedupBypassed bool
}

// Service processes events. It is safe for concurrent use; concurrent
// calls for the same event or the same order are serialized by Postgres.
type Service struct {
	db      Beginner
	charger Charger
	group   string
	now     func() time.Time
	logger  *slog.Logger
}

// New returns a Service that records events as processed for consumer
// group group.
func New(db Beginner, charger Charger, group string, now func() time.Time, logger *slog.Logger) *Service {
	return &Service{db: db, charger: charger, group: group, now: now, logger: logger}
}

// Process charges the order of ev exactly once.
//
// A nil error comes with Charged, Duplicate or DuplicateOrder. Errors carry
// a fault.Kind: Conflict (same order, different amount or customer; or a
// 422 from the provider), Permanent (the provider rejected the charge),
// Systemic (credentials rejected, database unreachable) or Transient
// (retry). After any error nothing was recorded, so the event can be
// retried or dead-lettered safely.
func (s *Service) Process(ctx context.Context, ev events.OrderConfirmed) (Result, error) {
	res, err := s.process(ctx, ev, true)
	if errors.Is(err, dedup.ErrNoPartition) {
		// The failed insert aborted the transaction: redo it without the
		// processed_event row. The ledger's order_id key still guarantees
		// one charge per order.
		s.logger.WarnContext(ctx, "event outside dedup partitions, ledger decides",
			"event_id", ev.EventID, "order_id", ev.OrderID)
		res, err = s.process(ctx, ev, false)
		res.DedupBypassed = true
	}
	return res, err
}

func (s *Service) process(ctx context.Context, ev events.OrderConfirmed, withDedup bool) (Result, error) {
	var res Result
	var chargeErr error
	err := withTx(ctx, s.db, func(tx pgx.Tx) error {
		res, chargeErr = Result{}, nil
		now := s.now()
		if withDedup {
			fresh, err := dedup.MarkProcessed(ctx, tx, ev.EventID, s.group, now)
			if errors.Is(err, dedup.ErrNoPartition) {
				return err
			}
			if err != nil {
				return classifyDB(err)
			}
			if !fresh {
				res.Outcome = Duplicate
				return nil
			}
		}
		charged, err := s.claimOrder(ctx, tx, ev, now)
		if err != nil || charged != "" {
			res.Outcome = charged
			return err
		}
		r, err := s.charger.Charge(ctx, payment.Charge{
			IdempotencyKey: ev.EventID.String(),
			OrderID:        ev.OrderID,
			CustomerID:     ev.CustomerID,
			Amount:         ev.TotalAmount,
		})
		if err != nil {
			chargeErr = fmt.Errorf("charge order %d: %w", ev.OrderID, err)
			return s.settleFailedCharge(context.WithoutCancel(ctx), tx, ev, withDedup, err)
		}
		if _, err := tx.Exec(ctx, recordChargeSQL, ev.OrderID, r.ChargeID, s.now()); err != nil {
			return classifyDB(fmt.Errorf("record charge of order %d: %w", ev.OrderID, err))
		}
		res = Result{Outcome: Charged, ChargeID: r.ChargeID}
		return nil
	})
	if err != nil && !errors.Is(err, dedup.ErrNoPartition) && !isClassified(err) {
		// Begin or Commit failed.
		err = classifyDB(err)
	}
	if err == nil {
		err = chargeErr
	}
	return res, err
}

// settleFailedCharge keeps, in tx, what a failed charge must leave behind.
// The event is not done, so its processed_event row goes. Its ledger claim
// stays, as 'pending', unless the failure proves nothing was taken (the
// provider refused the charge, or it was never sent): a charge whose
// outcome is unknown keeps the order claimed by this event, so no other
// event for the order can charge it before this one's retry settles it.
// tx then commits.
func (s *Service) settleFailedCharge(ctx context.Context, tx pgx.Tx, ev events.OrderConfirmed, withDedup bool, cause error) error {
	if withDedup {
		if _, err := tx.Exec(ctx, unmarkSQL, ev.EventID, s.group); err != nil {
			return classifyDB(err)
		}
	}
	if k := fault.KindOf(cause); k == fault.Permanent || k == fault.Invalid {
		if _, err := tx.Exec(ctx, releaseClaimSQL, ev.OrderID, ev.EventID); err != nil {
			return classifyDB(err)
		}
	}
	return nil
}

// withTx runs fn in a transaction, like pgx.BeginFunc, but commits with a
// context that outlives ctx (bounded): when a shutdown cancels ctx during
// a charge, the pending claim must still be committed.
func withTx(ctx context.Context, db Beginner, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return tx.Commit(cctx)
}

const (
	claimOrderSQL = `INSERT INTO charge (order_id, event_id, customer_id, amount, charged_at, status)
VALUES ($1, $2, $3, $4::numeric, $5, 'pending') ON CONFLICT DO NOTHING`
	existingChargeSQL = `SELECT event_id, customer_id, amount::text, status FROM charge WHERE order_id = $1`
	recordChargeSQL   = `UPDATE charge SET provider_charge_id = $2, charged_at = $3, status = 'charged' WHERE order_id = $1`
	unmarkSQL         = `DELETE FROM processed_event WHERE event_id = $1 AND consumer_group = $2`
	releaseClaimSQL   = `DELETE FROM charge WHERE order_id = $1 AND event_id = $2 AND status = 'pending'`
)

// claimOrder inserts the order's ledger row. An empty outcome and nil error
// mean the row is ours and the order must be charged; otherwise the order
// was already charged and the outcome (or a Conflict error) says by whom.
func (s *Service) claimOrder(ctx context.Context, tx pgx.Tx, ev events.OrderConfirmed, now time.Time) (Outcome, error) {
	tag, err := tx.Exec(ctx, claimOrderSQL, ev.OrderID, ev.EventID, ev.CustomerID, ev.TotalAmount.String(), now)
	if err != nil {
		return "", classifyDB(fmt.Errorf("claim order %d: %w", ev.OrderID, err))
	}
	if tag.RowsAffected() == 1 {
		return "", nil
	}
	var (
		eventID    uuid.UUID
		customerID int64
		amount     string
		status     string
	)
	err = tx.QueryRow(ctx, existingChargeSQL, ev.OrderID).Scan(&eventID, &customerID, &amount, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		// The insert conflicted on event_id, not order_id: this event_id
		// already charged another order. A producer bug or a forgery.
		return "", fault.Errorf(fault.Conflict, "event %s already charged a different order than %d", ev.EventID, ev.OrderID)
	}
	if err != nil {
		return "", classifyDB(fmt.Errorf("read charge of order %d: %w", ev.OrderID, err))
	}
	switch {
	case eventID == ev.EventID && status == "pending":
		return "", nil // our own earlier charge, outcome unknown: charge again, same key
	case eventID == ev.EventID:
		return Duplicate, nil
	case status == "pending":
		return "", fault.Errorf(fault.Transient, "order %d has a charge of unknown outcome by event %s; waiting for it to settle", ev.OrderID, eventID)
	case amount != ev.TotalAmount.String() || customerID != ev.CustomerID:
		return "", fault.Errorf(fault.Conflict, "order %d already charged by event %s with other parameters", ev.OrderID, eventID)
	default:
		s.logger.InfoContext(ctx, "order already charged by another event", "event_id", ev.EventID,
			"order_id", ev.OrderID, "charged_by", eventID)
		return DuplicateOrder, nil
	}
}

func isClassified(err error) bool {
	var e *fault.Error
	return errors.As(err, &e)
}
