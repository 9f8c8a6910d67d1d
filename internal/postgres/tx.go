package postgres

// pgTx, a billing transaction on Postgres: the charge transaction's and
// the completer's settling statements, and the stray 2xx's.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
)

// pgTx is a Tx on a pgx transaction.
type pgTx struct {
	tx pgx.Tx
}

// recordSQL marks claims charged and returns the event ids it marked. It
// matches on the owning event, whatever the status: a 2xx for the claim's
// key is the truth about the money, even when the completer blocked the
// claim meanwhile.
const recordSQL = `UPDATE charge AS c SET provider_charge_id = v.id, charged_at = $4, status = 'charged'
FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS v(o, e, id) WHERE c.order_id = v.o AND c.event_id = v.e
RETURNING c.event_id`

// holdSQL locks the pending claims of the pairs given FOR KEY SHARE, in
// order, for the charge transaction, and returns those it locked.
const holdSQL = `SELECT c.event_id FROM charge AS c JOIN unnest($1::bigint[], $2::uuid[]) AS v(o, e)
ON c.order_id = v.o AND c.event_id = v.e WHERE c.status = 'pending' ORDER BY c.order_id FOR KEY SHARE OF c`

const (
	// stillUnknownSQL records a re-send whose outcome stayed unknown; a
	// parked claim's next re-send backs off exponentially from a second,
	// capped at $4 milliseconds.
	stillUnknownSQL = `UPDATE charge SET settle_attempts = settle_attempts + 1, last_error = $3,
next_send_at = CASE WHEN parked_at IS NULL THEN NULL
  ELSE now() + least(interval '1 second' * power(2, least(settle_attempts, 16)), $4 * interval '1 millisecond') END
WHERE order_id = $1 AND event_id = $2 AND status = 'pending'`
)

const (
	strayRowSQL = `SELECT event_id, status FROM charge WHERE order_id = $1 FOR UPDATE`
	// strayClaimSQL inserts the event's own claim, charged, for an order
	// without a row; nothing when a row (or the event's id on another
	// order) appeared meanwhile.
	strayClaimSQL = `INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status, provider_charge_id, claimed_by)
VALUES ($1, $2, $3, $4::numeric, now(), $5, 'charged', $6, $7) ON CONFLICT DO NOTHING`
	strayBlockSQL = `UPDATE charge SET status = 'blocked', last_error = $3 WHERE order_id = $1 AND event_id = $2 AND status = 'pending'`
	strayLogSQL   = `INSERT INTO stray_charge (order_id, event_id, provider_charge_id, sender, claim_event_id, claim_status)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING at`
)

// MarkProcessed inserts the processed_event rows (dedup.MarkProcessed).
func (t pgTx) MarkProcessed(ctx context.Context, ids []uuid.UUID, group string, at time.Time) ([]uuid.UUID, error) {
	fresh, err := dedup.MarkProcessed(ctx, t.tx, ids, group, at)
	if errors.Is(err, dedup.ErrNoPartition) {
		return nil, fmt.Errorf("mark %d events processed: %w", len(ids), billing.ErrNoPartition)
	}
	if err != nil {
		return nil, classifyDB(err)
	}
	return fresh, nil
}

// Unmark deletes the processed_event rows (dedup.Unmark).
func (t pgTx) Unmark(ctx context.Context, ids []uuid.UUID, group string) error {
	return classifyDB(dedup.Unmark(ctx, t.tx, ids, group))
}

// HoldClaims runs holdSQL.
func (t pgTx) HoldClaims(ctx context.Context, orders []int64, ids []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := t.tx.Query(ctx, holdSQL, orders, dedup.Binary(ids))
	var held []uuid.UUID
	if err == nil {
		held, err = dedup.CollectUUIDs(rows)
	}
	if err != nil {
		return nil, classifyDB(fmt.Errorf("hold %d claims: %w", len(orders), err))
	}
	return held, nil
}

// MarkCharged runs recordSQL.
func (t pgTx) MarkCharged(ctx context.Context, orders []int64, ids []uuid.UUID, chargeIDs []string, at time.Time) ([]uuid.UUID, error) {
	rows, err := t.tx.Query(ctx, recordSQL, orders, dedup.Binary(ids), chargeIDs, at)
	var marked []uuid.UUID
	if err == nil {
		marked, err = dedup.CollectUUIDs(rows)
	}
	return marked, classifyDB(err)
}

// BlockClaims runs blockSQL.
func (t pgTx) BlockClaims(ctx context.Context, orders []int64, ids []uuid.UUID, why string) (int64, error) {
	tag, err := t.tx.Exec(ctx, blockSQL, orders, dedup.Binary(ids), why)
	return tag.RowsAffected(), classifyDB(err)
}

// RecordUnknown runs stillUnknownSQL.
func (t pgTx) RecordUnknown(ctx context.Context, order int64, id uuid.UUID, why string, backoffMax time.Duration) error {
	_, err := t.tx.Exec(ctx, stillUnknownSQL, order, [16]byte(id), why, backoffMax.Milliseconds())
	return classifyDB(err)
}

// LockClaimRow runs strayRowSQL.
func (t pgTx) LockClaimRow(ctx context.Context, order int64) (uuid.UUID, billing.ClaimState, bool, error) {
	var owner [16]byte
	var status string
	err := t.tx.QueryRow(ctx, strayRowSQL, order).Scan(&owner, &status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return uuid.UUID{}, "", false, nil
	case err != nil:
		return uuid.UUID{}, "", false, classifyDB(err)
	}
	return owner, billing.ClaimState(status), true, nil
}

// InsertStrayClaim runs strayClaimSQL.
func (t pgTx) InsertStrayClaim(ctx context.Context, st billing.StrayRecord) (bool, error) {
	tag, err := t.tx.Exec(ctx, strayClaimSQL, st.OrderID, [16]byte(st.EventID), st.CustomerID, st.Amount.String(), st.ChargedAt, st.ChargeID, st.Host)
	if err != nil {
		return false, classifyDB(err)
	}
	return tag.RowsAffected() > 0, nil
}

// BlockStrayClaim runs strayBlockSQL.
func (t pgTx) BlockStrayClaim(ctx context.Context, order int64, owner uuid.UUID, why string) error {
	_, err := t.tx.Exec(ctx, strayBlockSQL, order, [16]byte(owner), why)
	return classifyDB(err)
}

// LogStray runs strayLogSQL.
func (t pgTx) LogStray(ctx context.Context, st billing.StrayRecord, claimEvent *uuid.UUID, claimState *billing.ClaimState) (time.Time, error) {
	var event *[16]byte
	var status *string
	if claimEvent != nil {
		event = (*[16]byte)(claimEvent)
	}
	if claimState != nil {
		status = (*string)(claimState)
	}
	var at time.Time
	err := t.tx.QueryRow(ctx, strayLogSQL, st.OrderID, [16]byte(st.EventID), st.ChargeID, st.Sender, event, status).Scan(&at)
	return at, classifyDB(err)
}

// Commit commits the transaction.
func (t pgTx) Commit(ctx context.Context) error { return classifyDB(t.tx.Commit(ctx)) }

// Rollback rolls the transaction back; after Commit it is a no-op.
func (t pgTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }
