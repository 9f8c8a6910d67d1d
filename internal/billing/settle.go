package billing

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// The completer's settling of claims: what a pass does to each stale or
// parked pending claim it reads (the table is Completer's doc comment).

// settleStale settles the pending claims older than the pass's age. It
// stops with ErrPaused at the first claim it finds paused (Paused): the
// claims settled before are returned.
func (c *Completer) settleStale(ctx context.Context, conn *pgxpool.Conn, opt PassOptions) ([]Settled, error) {
	age := c.After
	if opt.OlderThan > 0 {
		age = opt.OlderThan
	}
	limit := c.Limit
	if limit <= 0 {
		limit = 100
	}
	qctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	sql, args := staleClaimsSQL, []any{age.Milliseconds(), limit}
	if opt.ParkedOnly {
		sql, args = parkedDueSQL, []any{limit}
	}
	rows, err := conn.Query(qctx, sql, args...)
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
		next, effects, err := cl.Status.Next(c.input(cl, AnswerNone, c.paused() && !opt.DryRun))
		if err != nil { // ErrPaused
			return done, err
		}
		if opt.DryRun {
			what := "would re-send"
			if next == ClaimBlocked {
				what = "would block"
			}
			done = append(done, Settled{Claim: cl, Result: what})
			continue
		}
		s, err := c.settle(ctx, conn, cl, effects)
		if err != nil {
			return done, err
		}
		done = append(done, s)
	}
	return done, nil
}

// input is the completer's question about cl to the claim's transition
// function.
func (c *Completer) input(cl Claim, ans Answer, paused bool) ClaimInput {
	return ClaimInput{Actor: ActorCompleter, Answer: ans, Paused: paused, Age: cl.Age, BlockAfter: c.BlockAfter}
}

// settle carries out effects, the claim's transition for the completer's
// send on cl (ClaimState.Next): blocked without a re-send when it is older
// than BlockAfter, else its request re-sent and the answer's effects
// carried out. Before the request leaves, markSent records, committed,
// that the completer sends it, until when (Sends; the request never
// leaves after that deadline), so that its creating attempt, refused
// meanwhile, can no longer release it; and the settling transaction holds
// the claim (holdClaims) from before the request to the record, for a
// binary built before others_sent_at that may run beside this one during
// an upgrade. Its error is the pass's (a systemic answer, ctx ended, the
// database, ErrPaused when the pause came between the pass's check and
// the request): nothing more is to be done in this pass.
func (c *Completer) settle(ctx context.Context, conn *pgxpool.Conn, cl Claim, effects []Effect) (Settled, error) {
	out := Settled{Claim: cl}
	orders, ids := []int64{cl.OrderID}, [][16]byte{cl.EventID}
	if slices.Contains(effects, EffectBlock) {
		out.Result, out.Detail = string(ClaimBlocked), fmt.Sprintf("outcome still unknown %s after the claim, past the block-after limit: not re-sent", cl.Age.Round(time.Second))
		return out, c.write(ctx, conn, &out, blockSQL, orders, ids, out.Detail)
	}
	sends := c.Sends.withDefaults()
	deadline := sends.deadline() // before the record: SPEC §11 I5
	pending, err := markSent(ctx, conn, c.dbTimeout(), sends, orders, ids, []string{cmp.Or(c.Sender, SenderCompleter)})
	if err != nil {
		return out, fmt.Errorf("completer: settle order %d: %w", cl.OrderID, err)
	}
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
	if pending[cl.EventID] {
		if pending, err = holdClaims(ctx, tx, c.dbTimeout(), orders, ids); err != nil {
			return out, fmt.Errorf("completer: settle order %d: %w", cl.OrderID, err)
		}
	}
	if !pending[cl.EventID] {
		out.Result, out.Detail = SettledMeanwhile, "released or settled since the pass read it; nothing sent"
		return out, nil
	}
	if _, _, err := cl.Status.Next(c.input(cl, AnswerNone, c.paused())); err != nil {
		return out, err // the pause came since the pass's check: the hold rolls back, nothing sent
	}
	sctx, cancelSend := context.WithDeadline(ctx, deadline)
	r, err := c.Charger.Charge(sctx, chargeRequest(cl.EventID.String(), cl.OrderID, cl.CustomerID, cl.Amount))
	cancelSend()
	switch {
	case err != nil && fault.KindOf(err) == fault.Systemic:
		return out, fmt.Errorf("completer: settle order %d: %w", cl.OrderID, err)
	case err != nil && ctx.Err() != nil:
		return out, ctx.Err()
	}
	_, effects, _ = cl.Status.Next(c.input(cl, answerOf(err), false))
	switch {
	case slices.Contains(effects, EffectMarkCharged):
		out.Result, out.Detail = string(ClaimCharged), r.ChargeID
		err = c.writeCharged(ctx, tx, &out, r.ChargeID)
	case slices.Contains(effects, EffectBlock):
		out.Result, out.Detail = string(ClaimBlocked), fmt.Sprintf("re-sent by the completer: %v", err)
		err = c.write(ctx, tx, &out, blockSQL, orders, ids, out.Detail)
	default: // EffectRecordUnknown
		out.Result, out.Detail = string(ClaimPending), err.Error()
		err = c.write(ctx, tx, &out, stillUnknownSQL, cl.OrderID, [16]byte(cl.EventID), out.Detail, c.parkedBackoff().Milliseconds())
	}
	return out, err
}

// writeCharged records the 2xx of out's claim in tx and commits it, like
// write. A claim gone or another event's by then (recordSQL marks
// nothing) is a stray charge (recordStray, the 2xx rule), recorded in tx
// all the same. The settling transaction's hold (FOR KEY SHARE, from
// before the request) keeps any DELETE of the claim or change of its key
// out until this record, so on Postgres this branch is a guard only: a
// 2xx is never dropped, whatever the ledger says.
func (c *Completer) writeCharged(ctx context.Context, tx pgx.Tx, out *Settled, chargeID string) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.dbTimeout())
	defer cancel()
	at := c.Now()
	tag, err := tx.Exec(wctx, recordSQL, []int64{out.OrderID}, [][16]byte{out.EventID}, []string{chargeID}, at)
	if err != nil {
		return fmt.Errorf("completer: record order %d as charged: %w", out.OrderID, err)
	}
	if tag.RowsAffected() == 1 {
		return c.commitAndLog(ctx, wctx, tx, out)
	}
	sc, err := recordStray(wctx, tx, stray{order: out.OrderID, customer: out.CustomerID, event: out.EventID, amount: out.Amount.String(),
		chargeID: chargeID, sender: cmp.Or(c.Sender, SenderCompleter), host: c.Sends.Host, chargedAt: at})
	if err != nil {
		return fmt.Errorf("completer: record order %d as charged: %w", out.OrderID, err)
	}
	out.Detail = fmt.Sprintf("%s (stray charge: the claim was %s when the 2xx came; the order's row is now %s)", chargeID, sc.ClaimState, sc.Moved)
	if err := c.commitAndLog(ctx, wctx, tx, out); err != nil {
		return err
	}
	logStray(ctx, c.Logger, sc)
	return nil
}

// executor is where write runs its statement: the completer's connection,
// or its settling transaction (then write commits it).
type executor interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// write runs the statement that records what settle did to out's claim,
// on a context that outlives ctx (the provider's answer must be kept),
// commits it when db is a transaction, and logs it.
func (c *Completer) write(ctx context.Context, db executor, out *Settled, sql string, args ...any) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.dbTimeout())
	defer cancel()
	if _, err := db.Exec(wctx, sql, args...); err != nil {
		return fmt.Errorf("completer: record order %d as %s: %w", out.OrderID, out.Result, err)
	}
	return c.commitAndLog(ctx, wctx, db, out)
}

// commitAndLog commits db on wctx when it is a transaction, and logs what
// settle did to out's claim.
func (c *Completer) commitAndLog(ctx, wctx context.Context, db executor, out *Settled) error {
	if tx, ok := db.(pgx.Tx); ok {
		if err := tx.Commit(wctx); err != nil {
			return fmt.Errorf("completer: record order %d as %s: commit: %w", out.OrderID, out.Result, err)
		}
	}
	level := slog.LevelInfo
	if out.Result == string(ClaimBlocked) {
		level = slog.LevelError
	}
	c.Logger.Log(ctx, level, "ledger claim settled by the completer", "order_id", out.OrderID, "event_id", out.EventID,
		"result", out.Result, "detail", out.Detail)
	return nil
}
