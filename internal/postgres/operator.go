package postgres

// The Store's statements for the operator's commands (billing.OperatorStore:
// claim show, release, mark-charged).

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/billing"
)

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

// oldReplicasSQL reads, by the database's clock, now(), and the replicas
// of a level below $1 that may still have a request at the provider:
// those whose heartbeat is fresher than $2 ms (the stale window, after
// which a SIGKILLed replica no longer runs) plus $3 ms (the provider's
// bound on its last request): how many, when the last of them is past
// that, and who they are.
const oldReplicasSQL = `SELECT now(), count(*), max(heartbeat_at) + ($2::bigint + $3::bigint) * interval '1 millisecond',
coalesce(string_agg(replica_id || ' (level ' || binary_level || ')', ', ' ORDER BY replica_id), '')
FROM billing_replica WHERE binary_level < $1 AND heartbeat_at > now() - ($2::bigint + $3::bigint) * interval '1 millisecond'`

// ReadClaim reads the order's claim.
func (s *Store) ReadClaim(ctx context.Context, order int64) (billing.OperatorClaim, bool, error) {
	rows, err := s.db.Query(ctx, `SELECT `+operatorColumns+` FROM charge WHERE order_id = $1`, order)
	if err != nil {
		return billing.OperatorClaim{}, false, err
	}
	cl, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (billing.OperatorClaim, error) { return scanOperatorClaim(r) })
	if errors.Is(err, pgx.ErrNoRows) {
		return billing.OperatorClaim{}, false, nil
	}
	return cl, err == nil, err
}

// AuditTrail reads the order's claim_audit rows.
func (s *Store) AuditTrail(ctx context.Context, order int64) ([]billing.AuditEntry, error) {
	rows, err := s.db.Query(ctx, `SELECT at, action, operator, host, reason, before::text, coalesce(after::text, '')
FROM claim_audit WHERE order_id = $1 ORDER BY at, id`, order)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.AuditEntry, error) {
		var a billing.AuditEntry
		err := r.Scan(&a.At, &a.Action, &a.Operator, &a.Host, &a.Reason, &a.Before, &a.After)
		return a, err
	})
}

// RecordedSends reads the order's claim_send rows.
func (s *Store) RecordedSends(ctx context.Context, order int64) ([]billing.Send, error) {
	rows, err := s.db.Query(ctx, `SELECT sender, event_id, host, sent_at, in_flight_until FROM claim_send WHERE order_id = $1 ORDER BY id`, order)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.Send, error) {
		var s billing.Send
		err := r.Scan(&s.Sender, &s.EventID, &s.Host, &s.SentAt, &s.InFlightUntil)
		return s, err
	})
}

// DeferredOn reads the deferred_event rows of the order.
func (s *Store) DeferredOn(ctx context.Context, order int64) ([]billing.DeferredBehind, error) {
	rows, err := s.db.Query(ctx, `SELECT consumer_group, event_id, waits_for, deferred_at, attempts, coalesce(last_error, '')
FROM deferred_event WHERE order_id = $1 ORDER BY consumer_group, seq`, order)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.DeferredBehind, error) {
		var d billing.DeferredBehind
		err := r.Scan(&d.Group, &d.EventID, &d.WaitsFor, &d.DeferredAt, &d.Attempts, &d.LastError)
		return d, err
	})
}

// StrayCharges reads the order's stray_charge rows.
func (s *Store) StrayCharges(ctx context.Context, order int64) ([]billing.StrayCharge, error) {
	rows, err := s.db.Query(ctx, `SELECT order_id, event_id, provider_charge_id, at, sender, claim_event_id, coalesce(claim_status, 'released')
FROM stray_charge WHERE order_id = $1 ORDER BY id`, order)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.StrayCharge, error) {
		var s billing.StrayCharge
		var claimEvent pgtype.UUID
		var status string
		err := r.Scan(&s.OrderID, &s.EventID, &s.ProviderChargeID, &s.At, &s.Sender, &claimEvent, &status)
		if claimEvent.Valid {
			s.ClaimEventID = claimEvent.Bytes
		}
		s.ClaimState = billing.ClaimState(status)
		return s, err
	})
}

// InOperatorTx runs fn in a transaction of the store's DB (pgx.BeginFunc).
func (s *Store) InOperatorTx(ctx context.Context, fn func(billing.OperatorTx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error { return fn(operatorTx{tx: tx}) })
}

// operatorTx is a billing.OperatorTx on a pgx transaction.
type operatorTx struct {
	tx pgx.Tx
}

// LockClaim reads the order's claim FOR UPDATE, and its row as JSON.
func (t operatorTx) LockClaim(ctx context.Context, order int64) (billing.OperatorClaim, string, bool, error) {
	var rowJSON string
	cl, err := scanOperatorClaim(t.tx.QueryRow(ctx,
		`SELECT `+operatorColumns+`, to_jsonb(c)::text FROM charge c WHERE order_id = $1 FOR UPDATE`, order), &rowJSON)
	if errors.Is(err, pgx.ErrNoRows) {
		return billing.OperatorClaim{}, "", false, nil
	}
	return cl, rowJSON, err == nil, err
}

// CountStrays runs straysSQL.
func (t operatorTx) CountStrays(ctx context.Context, order int64) (int, error) {
	var n int
	err := t.tx.QueryRow(ctx, straysSQL, order).Scan(&n)
	return n, err
}

// OldReplicas runs oldReplicasSQL, with migrations.ReplicaStaleAfter as
// the stale window.
func (t operatorTx) OldReplicas(ctx context.Context, below int, bound time.Duration) (billing.OldReplicas, error) {
	var old billing.OldReplicas
	var until *time.Time
	stale := migrations.ReplicaStaleAfter.Milliseconds()
	if err := t.tx.QueryRow(ctx, oldReplicasSQL, below, stale, bound.Milliseconds()).Scan(&old.Now, &old.Count, &until, &old.Who); err != nil {
		return old, err
	}
	if until != nil {
		old.Until = *until
	}
	return old, nil
}

// ReleaseBlocked runs releaseClaimSQL.
func (t operatorTx) ReleaseBlocked(ctx context.Context, order int64, event uuid.UUID) (int64, error) {
	tag, err := t.tx.Exec(ctx, releaseClaimSQL, order, event)
	return tag.RowsAffected(), err
}

// MarkChargedAs runs markChargedSQL.
func (t operatorTx) MarkChargedAs(ctx context.Context, order int64, event uuid.UUID, chargeID, status string) (string, error) {
	var after string
	err := t.tx.QueryRow(ctx, markChargedSQL, order, event, chargeID, status).Scan(&after)
	return after, err
}

// Audit runs auditSQL.
func (t operatorTx) Audit(ctx context.Context, order int64, action billing.OperatorAction, operator, host, reason, before string, after *string) error {
	_, err := t.tx.Exec(ctx, auditSQL, order, string(action), operator, host, reason, before, after)
	return err
}

// scanOperatorClaim scans operatorColumns, then extra.
func scanOperatorClaim(row pgx.Row, extra ...any) (billing.OperatorClaim, error) {
	var c billing.OperatorClaim
	var token *uuid.UUID
	var inFlight, decideAfter *time.Time
	var parked bool
	dest := append([]any{&c.OrderID, &c.EventID, &c.CustomerID, &c.Amount, &c.Status, &c.ProviderChargeID,
		&c.ChargedAt, &c.ClaimedAt, &c.SettleAttempts, &c.LastError, &token, &inFlight, &decideAfter, &c.ClaimedBy, &parked}, extra...)
	if err := row.Scan(dest...); err != nil {
		return billing.OperatorClaim{}, err
	}
	c.State = billing.ClaimStateOf(c.Status, parked)
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
