package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
)

// This file holds the operator's decisions on one ledger claim (`billing-
// consumer claim show|release|mark-charged`). The service itself never
// releases a blocked claim: the provider may hold the money, so a person
// looks the order up at the provider and decides. Only two moves exist,
// decided by the claim's transition function (ClaimState.Next,
// ActorOperator), each statement guarded by the status it starts from (a
// WHERE status = ...), so a completer settling the same claim at that
// moment is never overwritten, and each is written to claim_audit in the
// same transaction.

// OperatorAction is a change an operator may make to a claim.
type OperatorAction string

const (
	// ActionRelease deletes a blocked claim, so that a redelivery or a
	// replay of an event for the order may charge it. Allowed only when the
	// operator states that the provider holds no charge for it.
	ActionRelease OperatorAction = "release"
	// ActionMarkCharged records that the provider did take the charge,
	// with the provider's charge id: a pending or blocked claim becomes
	// charged and no event will ever charge the order again.
	ActionMarkCharged OperatorAction = "mark-charged"
)

// OperatorRequest is one decision on the claim of OrderID.
type OperatorRequest struct {
	OrderID int64
	Action  OperatorAction
	// Operator and Host say who made it and where (the pod); Reason why.
	// Operator and Reason are required.
	Operator, Host, Reason string
	// ProviderHoldsNoCharge must be true for a release: the operator has
	// checked at the provider that no charge exists for the claim's
	// idempotency key (its event_id).
	ProviderHoldsNoCharge bool
	// ChargeID is the provider's charge id, required by mark-charged.
	ChargeID string
}

// ErrNoClaim is returned when the order has no ledger row.
var ErrNoClaim = errors.New("no ledger claim for this order")

// ErrUnsafe wraps every refusal of a transition the claim's status does
// not allow (or that lacks what it needs); nothing was changed.
var ErrUnsafe = errors.New("refused")

// OperatorClaim is a ledger row as an operator sees it.
type OperatorClaim struct {
	OrderID, CustomerID int64
	EventID             uuid.UUID
	Amount              string // numeric as text: never a float
	Status              string // the status column
	// State is the claim's state (parked: a pending row with parked_at).
	State            ClaimState
	ProviderChargeID string
	ChargedAt        time.Time
	ClaimedAt        time.Time
	SettleAttempts   int
	LastError        string
	ClaimToken       uuid.UUID // zero when the row has none
	// InFlightUntil is the latest recorded send's deadline, DecideAfter
	// that plus the provider's bound: release and mark-charged refuse
	// before it (SPEC §11 I5). ClaimedBy is the replica that made the
	// claim. All zero for claims made before migration 00010.
	InFlightUntil, DecideAfter time.Time
	ClaimedBy                  string
}

// AuditEntry is one row of claim_audit.
type AuditEntry struct {
	At                     time.Time
	Action                 OperatorAction
	Operator, Host, Reason string
	// Before and After are the charge row as JSON; After is "" for a
	// release.
	Before, After string
}

// OperatorStore is what the operator's commands need of the database.
// Its errors carry no fault.Kind: an operator reads them.
type OperatorStore interface {
	// ReadClaim returns the order's claim; found is false when the order
	// has no ledger row.
	ReadClaim(ctx context.Context, order int64) (cl OperatorClaim, found bool, err error)
	// AuditTrail returns the order's claim_audit entries, oldest first.
	AuditTrail(ctx context.Context, order int64) ([]AuditEntry, error)
	// RecordedSends returns the sends recorded for the order's claims
	// (claim_send, not the creator's first send, which the claim holds),
	// in the order they were recorded.
	RecordedSends(ctx context.Context, order int64) ([]Send, error)
	// DeferredOn returns the events deferred on the order, in every
	// consumer group, in the order they will be decided.
	DeferredOn(ctx context.Context, order int64) ([]DeferredBehind, error)
	// StrayCharges returns the order's stray charges, oldest first, each
	// with the claim as its 2xx found it (Moved not set).
	StrayCharges(ctx context.Context, order int64) ([]StrayCharge, error)
	// InOperatorTx runs fn in one transaction, committed when fn returns
	// nil and rolled back otherwise; it returns fn's error as it is.
	InOperatorTx(ctx context.Context, fn func(OperatorTx) error) error
}

// OperatorTx is an operator's move in its transaction.
type OperatorTx interface {
	// LockClaim reads the order's claim FOR UPDATE, with its row as JSON
	// (the audit's before); found is false when the order has no row.
	LockClaim(ctx context.Context, order int64) (cl OperatorClaim, rowJSON string, found bool, err error)
	// CountStrays counts the stray charges recorded for the order.
	CountStrays(ctx context.Context, order int64) (int, error)
	// OldReplicas reads the database's clock and the replicas of a binary
	// below level that heartbeat recently enough, past bound, that a
	// request of theirs may still be in flight (see InFlightFacts).
	OldReplicas(ctx context.Context, below int, bound time.Duration) (OldReplicas, error)
	// ReleaseBlocked deletes the order's claim if it is event's and
	// blocked, and returns the rows deleted.
	ReleaseBlocked(ctx context.Context, order int64, event uuid.UUID) (int64, error)
	// MarkChargedAs marks the order's claim charged with chargeID if it is
	// event's and its status column is still status, and returns the row
	// after as JSON.
	MarkChargedAs(ctx context.Context, order int64, event uuid.UUID, chargeID, status string) (rowJSON string, err error)
	// Audit appends a claim_audit row: before and after the charge row as
	// JSON (after nil for a release).
	Audit(ctx context.Context, order int64, action OperatorAction, operator, host, reason, before string, after *string) error
}

// ShowClaim returns the claim of order and its audit trail, oldest first.
// It returns ErrNoClaim (with the trail, which outlives a released claim)
// when the order has no ledger row. It changes nothing.
func ShowClaim(ctx context.Context, db OperatorStore, order int64) (*OperatorClaim, []AuditEntry, error) {
	var cl *OperatorClaim
	row, found, err := db.ReadClaim(ctx, order)
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("read claim of order %d: %w", order, err)
	case found:
		cl = &row
	}
	trail, err := db.AuditTrail(ctx, order)
	if err != nil {
		return nil, nil, fmt.Errorf("read audit of order %d: %w", order, err)
	}
	if cl == nil {
		return nil, trail, ErrNoClaim
	}
	return cl, trail, nil
}

// ApplyOperator makes req's move on the claim of req.OrderID in one
// transaction: it locks the row, reads the facts the move is decided by —
// the stray charges recorded for the order, and whether a request for the
// claim may still take money (readInFlight) — decides the move with the
// claim's transition function (ClaimState.Next, ActorOperator), carries
// out its effects with statements that change the row only if it still
// has the status it was read with, and writes the audit row. It returns
// the claim as it was before, and logs the change. Errors: ErrNoClaim, an
// ErrUnsafe refusal (an *InFlightError, saying from when the move is
// allowed, among them), or a database error; in every case nothing was
// changed.
func ApplyOperator(ctx context.Context, db OperatorStore, logger *slog.Logger, req OperatorRequest) (OperatorClaim, error) {
	if strings.TrimSpace(req.Reason) == "" || strings.TrimSpace(req.Operator) == "" {
		return OperatorClaim{}, fmt.Errorf("%w: an operator and a reason are required", ErrUnsafe)
	}
	var before OperatorClaim
	var next ClaimState
	err := db.InOperatorTx(ctx, func(tx OperatorTx) error {
		var beforeJSON string
		var found bool
		var err error
		before, beforeJSON, found, err = tx.LockClaim(ctx, req.OrderID)
		if err != nil {
			return fmt.Errorf("read claim: %w", err)
		}
		if !found {
			return ErrNoClaim
		}
		move := OperatorMove{Action: req.Action, ProviderHoldsNoCharge: req.ProviderHoldsNoCharge, ChargeID: req.ChargeID}
		if move.StrayCharges, err = tx.CountStrays(ctx, req.OrderID); err != nil {
			return fmt.Errorf("read stray charges: %w", err)
		}
		if move.Window, err = readInFlight(ctx, tx, before); err != nil {
			return err
		}
		var effects []Effect
		if next, effects, err = before.State.Next(ClaimInput{Actor: ActorOperator, Operator: move}); err != nil {
			return err
		}
		return operate(ctx, tx, req, before, beforeJSON, effects)
	})
	if err != nil {
		return OperatorClaim{}, fmt.Errorf("%s order %d: %w", req.Action, req.OrderID, err)
	}
	logger.Info("operator changed a ledger claim", "action", string(req.Action), "order_id", req.OrderID,
		"event_id", before.EventID.String(), "before", before.Status, "after", string(next),
		"provider_charge_id", req.ChargeID, "operator", req.Operator, "host", req.Host, "reason", req.Reason)
	return before, nil
}

// operate carries out the effects of an operator's move on before, in tx.
func operate(ctx context.Context, tx OperatorTx, req OperatorRequest, before OperatorClaim, beforeJSON string, effects []Effect) error {
	var afterJSON *string
	for _, e := range effects {
		switch e {
		case EffectRelease:
			rows, err := tx.ReleaseBlocked(ctx, req.OrderID, before.EventID)
			if err != nil || rows != 1 {
				return fmt.Errorf("release claim (rows %d): %w", rows, err)
			}
		case EffectMarkCharged:
			after, err := tx.MarkChargedAs(ctx, req.OrderID, before.EventID, strings.TrimSpace(req.ChargeID), before.Status)
			if err != nil {
				return fmt.Errorf("mark claim charged: %w", err)
			}
			afterJSON = &after
		case EffectAudit:
			if err := tx.Audit(ctx, req.OrderID, req.Action, req.Operator, req.Host, req.Reason, beforeJSON, afterJSON); err != nil {
				return fmt.Errorf("write claim_audit: %w", err)
			}
		default:
			return fmt.Errorf("an operator's move has no effect %d", e)
		}
	}
	return nil
}
