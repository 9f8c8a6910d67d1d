package postgres

// Sessions, a completer's sessions on Postgres: one connection of the
// pool, held for a pass, on which the completer's advisory lock is taken.

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
	"github.com/billing-consumer/billing-consumer/internal/postgres/pglock"
)

// Sessions implements billing.Sessions on a DB: each session is one of
// its pool's connections, held for a completer's pass.
type Sessions struct {
	db *DB
}

// NewSessions returns the Sessions of db.
func NewSessions(db *DB) *Sessions { return &Sessions{db: db} }

// Acquire takes a connection of the pool for a session.
func (p *Sessions) Acquire(ctx context.Context) (billing.Session, error) {
	conn, err := p.db.pool.Acquire(ctx)
	if err != nil {
		return nil, classifyDB(err)
	}
	return pgSession{conn: conn}, nil
}

// pgSession is a Session on one pooled connection.
type pgSession struct {
	conn *pgxpool.Conn
}

const (
	// staleClaimsSQL selects the pending claims older than $1 and the
	// parked ones whose next re-send is due.
	staleClaimsSQL = `SELECT ` + claimColumns + ` FROM charge
WHERE status = 'pending' AND (claimed_at < now() - $1 * interval '1 millisecond' OR parked_at IS NOT NULL AND next_send_at <= now())
ORDER BY claimed_at LIMIT $2`
	unsettledSQL = `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'blocked'),
count(*) FILTER (WHERE status = 'pending' AND parked_at IS NOT NULL),
coalesce(max(` + ageColumn + `) FILTER (WHERE status = 'pending'), 0),
(SELECT count(*) FROM deferred_event d WHERE NOT EXISTS (SELECT 1 FROM charge p WHERE p.order_id = d.order_id AND p.event_id = d.event_id
  AND p.status = 'pending' AND p.parked_at IS NOT NULL)),
(SELECT count(DISTINCT s.order_id) FROM stray_charge s JOIN charge p ON p.order_id = s.order_id AND p.event_id <> s.event_id
  AND p.status = 'charged' AND p.provider_charge_id IS DISTINCT FROM s.provider_charge_id)
FROM charge WHERE status <> 'charged'`
	blockedSQL = `SELECT order_id, event_id, customer_id, amount::text, status, claimed_at, coalesce(last_error, '') FROM charge
WHERE status = 'blocked' ORDER BY claimed_at LIMIT 100`
)

// The completer's statements for parked claims.
const (
	// parkedDueSQL selects the parked claims whose next re-send is due.
	// It runs every second or so, under parkedDuePlan.
	parkedDueSQL = `SELECT ` + claimColumns + ` FROM charge
WHERE status = 'pending' AND parked_at IS NOT NULL AND next_send_at <= now() ORDER BY next_send_at LIMIT $1`
	// parkedDuePlan makes Postgres read parkedDueSQL's rows from
	// charge_parked_due, which holds the parked claims only. The planner
	// would read charge_unsettled instead, and sort: its statistics count
	// almost no unsettled claims, as a healthy ledger has few at any
	// moment, but that index also keeps an entry, dead until the next
	// VACUUM, for every claim settled since, and the scan steps over all
	// of them (7 ms a poll in the bench's drain, 0.7 µs of Postgres's CPU
	// per event billed). Without a sort, only charge_parked_due gives the
	// order asked for. SET LOCAL holds for the statement's transaction.
	// Postgres does not re-plan a prepared statement when a setting
	// changes, so ParkedDue must stay parkedDueSQL's only caller: then
	// every plan of it, custom or cached, is made under the setting.
	parkedDuePlan = `SET LOCAL enable_sort = off`
)

// TryLock takes the session's advisory lock key (pglock.TryLock).
func (s pgSession) TryLock(ctx context.Context, key int64, timeout time.Duration) (func(), bool, error) {
	unlock, locked, err := pglock.TryLock(ctx, s.conn, key, timeout)
	return unlock, locked, classifyDB(err)
}

// StaleClaims runs staleClaimsSQL.
func (s pgSession) StaleClaims(ctx context.Context, olderThan time.Duration, limit int) ([]billing.Claim, error) {
	claims, err := queryClaims(ctx, s.conn, staleClaimsSQL, olderThan.Milliseconds(), limit)
	return claims, classifyDB(err)
}

// ParkedDue runs parkedDueSQL under parkedDuePlan, in a transaction of
// its own.
func (s pgSession) ParkedDue(ctx context.Context, limit int) ([]billing.Claim, error) {
	var claims []billing.Claim
	err := pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, parkedDuePlan); err != nil {
			return err
		}
		var err error
		claims, err = queryClaims(ctx, tx, parkedDueSQL, limit)
		return err
	})
	return claims, classifyDB(err)
}

// CountUnsettled runs unsettledSQL.
func (s pgSession) CountUnsettled(ctx context.Context) (billing.Unsettled, error) {
	var u billing.Unsettled
	var oldest int64 // microseconds, by the database's clock
	if err := s.conn.QueryRow(ctx, unsettledSQL).Scan(&u.Pending, &u.Blocked, &u.Parked, &oldest, &u.Deferred, &u.StrayBeside); err != nil {
		return u, classifyDB(err)
	}
	u.OldestPending = max(0, time.Duration(oldest)*time.Microsecond)
	return u, nil
}

// BlockedClaims runs blockedSQL.
func (s pgSession) BlockedClaims(ctx context.Context) ([]billing.Settled, error) {
	rows, err := s.conn.Query(ctx, blockedSQL)
	if err != nil {
		return nil, classifyDB(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (billing.Settled, error) {
		var s billing.Settled
		var amount, status string
		if err := row.Scan(&s.OrderID, (*[16]byte)(&s.EventID), &s.CustomerID, &amount, &status, &s.ClaimedAt, &s.Detail); err != nil {
			return s, err
		}
		s.Status, s.Result = billing.ClaimState(status), string(billing.ClaimBlocked)
		a, err := money.ParseAmount(amount)
		s.Amount = a
		return s, err
	})
	return out, classifyDB(err)
}

// RecordSends runs markSentSQL on the session's connection.
func (s pgSession) RecordSends(ctx context.Context, sends billing.SendConfig, orders []int64, ids []uuid.UUID, senders []string) ([]uuid.UUID, error) {
	return recordSends(ctx, s.conn, sends, orders, ids, senders)
}

// BlockClaims runs blockSQL on the session's connection.
func (s pgSession) BlockClaims(ctx context.Context, orders []int64, ids []uuid.UUID, why string) (int64, error) {
	tag, err := s.conn.Exec(ctx, blockSQL, orders, dedup.Binary(ids), why)
	return tag.RowsAffected(), classifyDB(err)
}

// Begin begins a transaction on the session's connection.
func (s pgSession) Begin(ctx context.Context) (billing.Tx, error) {
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return nil, classifyDB(err)
	}
	return pgTx{tx: tx}, nil
}

// Release returns the connection to the pool.
func (s pgSession) Release() { s.conn.Release() }
