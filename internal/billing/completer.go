package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/pglock"
)

// settledMeanwhile is the Result of a claim that changed before it was held.
const settledMeanwhile = "settled meanwhile"

// completerLockKey is the Postgres advisory lock that lets one replica at a
// time settle claims ("complete" in ASCII).
const completerLockKey int64 = 0x636f6d706c657465

// Completer settles pending ledger claims that their events have not
// settled: the event was dead-lettered, its partition moved on, or the
// process that made the claim died. For each pending claim older than
// After it re-sends the claim's request — the claiming event's
// Idempotency-Key with the body rebuilt from the claim, byte-identical to
// the original — and settles it by the answer:
//
//	2xx                      charged, with the provider's charge id
//	422                      blocked (the key is bound to other parameters)
//	400, 402, 404            blocked: the refusal may be a stored answer
//	                         for a request that did not create the claim
//	timeout, reset, 5xx, 409 still pending
//	(claim older than        blocked without a re-send: the provider may
//	BlockAfter)              have forgotten the key
//	401, 403, certificate    the pass stops: nothing can be settled now
//
// A blocked claim is never released automatically: an operator decides.
// Several replicas may run a Completer: an advisory lock lets one of them
// settle at a time (the others only report the counts).
type Completer struct {
	Pool    *pgxpool.Pool
	Charger Charger
	// After is the age from which a pending claim is settled here rather
	// than left to its event's own retries.
	After time.Duration
	// BlockAfter is the age past which a claim whose outcome is still
	// unknown becomes blocked. It must stay well below the provider's
	// retention of idempotency keys: a key the provider has forgotten
	// would charge again.
	BlockAfter time.Duration
	// DBTimeout bounds each statement; zero means 10 s.
	DBTimeout time.Duration
	// Limit is the most claims settled in one pass; zero means 100.
	Limit  int
	Now    func() time.Time
	Logger *slog.Logger
}

// Unsettled counts the ledger claims that are not charged.
type Unsettled struct {
	Pending, Blocked int
	// OldestPending is the age of the oldest pending claim, 0 without one.
	OldestPending time.Duration
}

// Settled is what a pass did to one claim.
type Settled struct {
	Claim
	// Result is "charged", "blocked", "pending" (still unknown), "settled
	// meanwhile" (released or settled since the pass read it: nothing
	// sent), or, in a dry run, "would re-send" or "would block".
	Result string
	// Detail is the charge id, or why the claim is blocked or pending.
	Detail string
}

// PassReport is what one pass did.
type PassReport struct {
	// Skipped is true when another process held the completer's lock.
	Skipped bool
	Settled []Settled
	// Blocked are the blocked claims (the oldest 100), each with the
	// completer's last word on it, for an operator; only with
	// PassOptions.ListBlocked.
	Blocked []Settled
	// Unsettled counts the claims after the pass, when Counted.
	Unsettled Unsettled
	Counted   bool
}

// PassOptions tune one pass.
type PassOptions struct {
	// OlderThan overrides After when positive.
	OlderThan time.Duration
	// DryRun lists the claims that would be settled without sending
	// anything or changing the ledger.
	DryRun bool
	// ListBlocked also reads the blocked claims into the report (reconcile
	// shows them; the service's own passes need only their count).
	ListBlocked bool
}

const (
	staleClaimsSQL = `SELECT order_id, event_id, customer_id, amount::text, status, claimed_at, claim_token FROM charge
WHERE status = 'pending' AND claimed_at < $1 ORDER BY claimed_at LIMIT $2`
	unsettledSQL = `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'blocked'),
coalesce(min(claimed_at) FILTER (WHERE status = 'pending'), $1) FROM charge WHERE status <> 'charged'`
	blockedSQL = `SELECT order_id, event_id, customer_id, amount::text, status, claimed_at, coalesce(last_error, '') FROM charge
WHERE status = 'blocked' ORDER BY claimed_at LIMIT 100`
	// holdOneSQL locks a pending claim against its release (a DELETE)
	// for the settling transaction; it does not stop status updates.
	holdOneSQL      = `SELECT 1 FROM charge WHERE order_id = $1 AND event_id = $2 AND status = 'pending' FOR KEY SHARE`
	stillUnknownSQL = `UPDATE charge SET settle_attempts = settle_attempts + 1, last_error = $3
WHERE order_id = $1 AND event_id = $2 AND status = 'pending'`
)

// RunOnce makes one pass. Its error is a failure of the pass itself (the
// database, or a systemic answer of the provider); claims it could not
// settle are reported, not errors.
func (c *Completer) RunOnce(ctx context.Context, opt PassOptions) (PassReport, error) {
	if c.After <= 0 || c.BlockAfter <= c.After {
		return PassReport{}, fmt.Errorf("completer: after %v must be positive and below block-after %v", c.After, c.BlockAfter)
	}
	conn, err := c.Pool.Acquire(ctx)
	if err != nil {
		return PassReport{}, fmt.Errorf("completer: %w", err)
	}
	defer conn.Release()
	var rep PassReport
	if !opt.DryRun {
		unlock, locked, err := pglock.TryLock(ctx, conn, completerLockKey, c.dbTimeout())
		if err != nil {
			return rep, fmt.Errorf("completer lock: %w", err)
		}
		if !locked {
			rep.Skipped = true
		} else {
			defer unlock()
		}
	}
	if !rep.Skipped {
		rep.Settled, err = c.settleStale(ctx, conn, opt)
	}
	var uerr, berr error
	rep.Unsettled, uerr = c.count(ctx, conn)
	rep.Counted = uerr == nil
	if opt.ListBlocked && rep.Unsettled.Blocked > 0 {
		rep.Blocked, berr = c.blocked(ctx, conn)
	}
	return rep, errors.Join(err, uerr, berr)
}

// settleStale settles the pending claims older than the pass's age.
func (c *Completer) settleStale(ctx context.Context, conn *pgxpool.Conn, opt PassOptions) ([]Settled, error) {
	age := c.After
	if opt.OlderThan > 0 {
		age = opt.OlderThan
	}
	limit := c.Limit
	if limit <= 0 {
		limit = 100
	}
	now := c.Now()
	qctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	rows, err := conn.Query(qctx, staleClaimsSQL, now.Add(-age), limit)
	var claims []Claim
	if err == nil {
		claims, err = pgx.CollectRows(rows, scanClaim)
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("completer: read pending claims: %w", err)
	}
	var done []Settled
	for _, cl := range claims {
		if opt.DryRun {
			what := "would re-send"
			if now.Sub(cl.ClaimedAt) > c.BlockAfter {
				what = "would block"
			}
			done = append(done, Settled{Claim: cl, Result: what})
			continue
		}
		s, err := c.settle(ctx, conn, cl, now)
		if err != nil {
			return done, err
		}
		done = append(done, s)
	}
	return done, nil
}

// settle re-sends cl's request and records the answer, in one transaction
// that holds the claim (holdOneSQL) from before the request to the record:
// its creating attempt, refused meanwhile, may release it only before the
// hold (then nothing is sent) or after the record (then it is no longer
// pending).
func (c *Completer) settle(ctx context.Context, conn *pgxpool.Conn, cl Claim, now time.Time) (Settled, error) {
	out := Settled{Claim: cl}
	bctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	defer cancel()
	tx, err := conn.Begin(bctx)
	if err != nil {
		return out, fmt.Errorf("completer: settle order %d: begin: %w", cl.OrderID, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.dbTimeout())
		defer cancel()
		_ = tx.Rollback(rctx) // after a commit: a no-op
	}()
	var one int
	if err := tx.QueryRow(bctx, holdOneSQL, cl.OrderID, [16]byte(cl.EventID)).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
		out.Result, out.Detail = settledMeanwhile, "released or settled since the pass read it; nothing sent"
		return out, nil
	} else if err != nil {
		return out, fmt.Errorf("completer: settle order %d: hold the claim: %w", cl.OrderID, err)
	}
	sql, args, err := c.resend(ctx, cl, now, &out)
	if err != nil {
		return out, err
	}
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), c.dbTimeout())
	defer wcancel()
	if _, err := tx.Exec(wctx, sql, args...); err != nil {
		return out, fmt.Errorf("completer: record order %d as %s: %w", cl.OrderID, out.Result, err)
	}
	if err := tx.Commit(wctx); err != nil {
		return out, fmt.Errorf("completer: record order %d as %s: commit: %w", cl.OrderID, out.Result, err)
	}
	level := slog.LevelInfo
	if out.Result == statusBlocked {
		level = slog.LevelError
	}
	c.Logger.Log(ctx, level, "ledger claim settled by the completer", "order_id", cl.OrderID, "event_id", cl.EventID,
		"result", out.Result, "detail", out.Detail)
	return out, nil
}

// blocked reads the blocked claims with their last error.
func (c *Completer) blocked(ctx context.Context, conn *pgxpool.Conn) ([]Settled, error) {
	qctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	defer cancel()
	rows, err := conn.Query(qctx, blockedSQL)
	if err != nil {
		return nil, fmt.Errorf("completer: read blocked claims: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Settled, error) {
		var s Settled
		var amount string
		if err := row.Scan(&s.OrderID, (*[16]byte)(&s.EventID), &s.CustomerID, &amount, &s.Status, &s.ClaimedAt, &s.Detail); err != nil {
			return s, err
		}
		s.Result = statusBlocked
		a, err := money.ParseAmount(amount)
		s.Amount = a
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("completer: read blocked claims: %w", err)
	}
	return out, nil
}

// resend re-sends cl's request, fills in out by the answer and returns the
// statement that records it. A claim older than BlockAfter is blocked
// without being re-sent: the provider may have forgotten its key, and a
// forgotten key charges again. Its error is the pass's (a systemic answer,
// ctx ended): nothing is to be recorded.
func (c *Completer) resend(ctx context.Context, cl Claim, now time.Time, out *Settled) (string, []any, error) {
	if age := now.Sub(cl.ClaimedAt); age > c.BlockAfter {
		out.Result, out.Detail = statusBlocked, fmt.Sprintf("outcome still unknown %s after the claim, past the block-after limit: not re-sent", age.Round(time.Second))
		return blockSQL, []any{[]int64{cl.OrderID}, [][16]byte{cl.EventID}, out.Detail}, nil
	}
	r, err := c.Charger.Charge(ctx, chargeRequest(cl.EventID.String(), cl.OrderID, cl.CustomerID, cl.Amount))
	switch k := fault.KindOf(err); {
	case err == nil:
		out.Result, out.Detail = statusCharged, r.ChargeID
		return recordSQL, []any{[]int64{cl.OrderID}, [][16]byte{cl.EventID}, []string{r.ChargeID}, c.Now()}, nil
	case k == fault.Systemic:
		return "", nil, fmt.Errorf("completer: settle order %d: %w", cl.OrderID, err)
	case ctx.Err() != nil:
		return "", nil, ctx.Err()
	case k == fault.Conflict, k == fault.Permanent, k == fault.Invalid:
		out.Result, out.Detail = statusBlocked, fmt.Sprintf("re-sent by the completer: %v", err)
		return blockSQL, []any{[]int64{cl.OrderID}, [][16]byte{cl.EventID}, out.Detail}, nil
	default:
		out.Result, out.Detail = statusPending, err.Error()
		return stillUnknownSQL, []any{cl.OrderID, [16]byte(cl.EventID), out.Detail}, nil
	}
}

// count reads the unsettled claims.
func (c *Completer) count(ctx context.Context, conn *pgxpool.Conn) (Unsettled, error) {
	qctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	defer cancel()
	now := c.Now()
	var u Unsettled
	var oldest time.Time
	if err := conn.QueryRow(qctx, unsettledSQL, now).Scan(&u.Pending, &u.Blocked, &oldest); err != nil {
		return u, fmt.Errorf("completer: count claims: %w", err)
	}
	if u.Pending > 0 {
		u.OldestPending = max(0, now.Sub(oldest))
	}
	return u, nil
}

// Run makes a pass now and then every interval until ctx ends, logging
// failures (the next pass retries). onPass, when not nil, sees the counts
// after every pass that could read them (whatever else failed): the
// service sets the ledger gauges from them, and a pass that could not
// count leaves the gauges as they were rather than zeroing them.
func (c *Completer) Run(ctx context.Context, interval time.Duration, onPass func(Unsettled)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rep, err := c.RunOnce(ctx, PassOptions{})
		if err != nil && ctx.Err() == nil {
			c.Logger.ErrorContext(ctx, "completer pass failed", "err", err)
		}
		if onPass != nil && rep.Counted {
			onPass(rep.Unsettled)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Completer) dbTimeout() time.Duration {
	if c.DBTimeout > 0 {
		return c.DBTimeout
	}
	return 10 * time.Second
}
