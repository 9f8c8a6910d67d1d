package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

const (
	operatorColumns = `order_id, event_id, customer_id, amount::text, status, coalesce(provider_charge_id, ''),
charged_at, claimed_at, settle_attempts, coalesce(last_error, ''), claim_token,
in_flight_until, decide_after, coalesce(claimed_by, ''), parked_at IS NOT NULL`
	releaseClaimSQL = `DELETE FROM charge c WHERE order_id = $1 AND event_id = $2 AND status = 'blocked'`
	markChargedSQL  = `UPDATE charge c SET status = 'charged', provider_charge_id = $3, charged_at = now(), last_error = NULL
WHERE order_id = $1 AND event_id = $2 AND status = $4 RETURNING to_jsonb(c)`
	straysSQL = `SELECT count(*) FROM stray_charge WHERE order_id = $1`
	auditSQL  = `INSERT INTO claim_audit (order_id, action, operator, host, reason, before, after)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb) RETURNING at`
)

// ShowClaim returns the claim of order and its audit trail, oldest first.
// It returns ErrNoClaim (with the trail, which outlives a released claim)
// when the order has no ledger row. It changes nothing.
func ShowClaim(ctx context.Context, pool *pgxpool.Pool, order int64) (*OperatorClaim, []AuditEntry, error) {
	var cl *OperatorClaim
	row, err := scanOperatorClaim(pool.QueryRow(ctx, `SELECT `+operatorColumns+` FROM charge WHERE order_id = $1`, order))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, nil, fmt.Errorf("read claim of order %d: %w", order, err)
	default:
		cl = &row
	}
	rows, err := pool.Query(ctx, `SELECT at, action, operator, host, reason, before::text, coalesce(after::text, '')
FROM claim_audit WHERE order_id = $1 ORDER BY at, id`, order)
	if err != nil {
		return nil, nil, fmt.Errorf("read audit of order %d: %w", order, err)
	}
	trail, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		err := r.Scan(&a.At, &a.Action, &a.Operator, &a.Host, &a.Reason, &a.Before, &a.After)
		return a, err
	})
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
func ApplyOperator(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, req OperatorRequest) (OperatorClaim, error) {
	if strings.TrimSpace(req.Reason) == "" || strings.TrimSpace(req.Operator) == "" {
		return OperatorClaim{}, fmt.Errorf("%w: an operator and a reason are required", ErrUnsafe)
	}
	var before OperatorClaim
	var next ClaimState
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var beforeJSON string
		var err error
		before, err = scanOperatorClaim(tx.QueryRow(ctx,
			`SELECT `+operatorColumns+`, to_jsonb(c)::text FROM charge c WHERE order_id = $1 FOR UPDATE`, req.OrderID), &beforeJSON)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNoClaim
		}
		if err != nil {
			return fmt.Errorf("read claim: %w", err)
		}
		move := OperatorMove{Action: req.Action, ProviderHoldsNoCharge: req.ProviderHoldsNoCharge, ChargeID: req.ChargeID}
		if err := tx.QueryRow(ctx, straysSQL, req.OrderID).Scan(&move.StrayCharges); err != nil {
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
func operate(ctx context.Context, tx pgx.Tx, req OperatorRequest, before OperatorClaim, beforeJSON string, effects []Effect) error {
	var afterJSON *string
	for _, e := range effects {
		switch e {
		case EffectRelease:
			tag, err := tx.Exec(ctx, releaseClaimSQL, req.OrderID, before.EventID)
			if err != nil || tag.RowsAffected() != 1 {
				return fmt.Errorf("release claim (rows %d): %w", tag.RowsAffected(), err)
			}
		case EffectMarkCharged:
			afterJSON = new(string)
			if err := tx.QueryRow(ctx, markChargedSQL, req.OrderID, before.EventID, strings.TrimSpace(req.ChargeID), before.Status).Scan(afterJSON); err != nil {
				return fmt.Errorf("mark claim charged: %w", err)
			}
		case EffectAudit:
			if _, err := tx.Exec(ctx, auditSQL, req.OrderID, string(req.Action), req.Operator, req.Host, req.Reason, beforeJSON, afterJSON); err != nil {
				return fmt.Errorf("write claim_audit: %w", err)
			}
		default:
			return fmt.Errorf("an operator's move has no effect %d", e)
		}
	}
	return nil
}

// scanOperatorClaim scans operatorColumns, then extra.
func scanOperatorClaim(row pgx.Row, extra ...any) (OperatorClaim, error) {
	var c OperatorClaim
	var token *uuid.UUID
	var inFlight, decideAfter *time.Time
	var parked bool
	dest := append([]any{&c.OrderID, &c.EventID, &c.CustomerID, &c.Amount, &c.Status, &c.ProviderChargeID,
		&c.ChargedAt, &c.ClaimedAt, &c.SettleAttempts, &c.LastError, &token, &inFlight, &decideAfter, &c.ClaimedBy, &parked}, extra...)
	if err := row.Scan(dest...); err != nil {
		return OperatorClaim{}, err
	}
	c.State = ClaimStateOf(c.Status, parked)
	if token != nil {
		c.ClaimToken = *token
	}
	if inFlight != nil {
		c.InFlightUntil = *inFlight
	}
	if decideAfter != nil {
		c.DecideAfter = *decideAfter
	}
	return c, nil
}
