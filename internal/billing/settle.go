package billing

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// The completer's settling of claims: what a pass does to each stale or
// parked pending claim it reads (the table is Completer's doc comment).

// settleStale settles the pending claims older than the pass's age. It
// stops with ErrPaused at the first claim it finds paused (Paused): the
// claims settled before are returned.
func (c *Completer) settleStale(ctx context.Context, sess Session, opt PassOptions) ([]Settled, error) {
	age := c.After
	if opt.OlderThan > 0 {
		age = opt.OlderThan
	}
	limit := c.Limit
	if limit <= 0 {
		limit = 100
	}
	qctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	var claims []Claim
	var err error
	if opt.ParkedOnly {
		claims, err = sess.ParkedDue(qctx, limit)
	} else {
		claims, err = sess.StaleClaims(qctx, age, limit)
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
		s, err := c.settle(ctx, sess, cl, effects)
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
func (c *Completer) settle(ctx context.Context, sess Session, cl Claim, effects []Effect) (Settled, error) {
	out := Settled{Claim: cl}
	orders, ids := []int64{cl.OrderID}, []uuid.UUID{cl.EventID}
	if slices.Contains(effects, EffectBlock) {
		out.Result, out.Detail = string(ClaimBlocked), fmt.Sprintf("outcome still unknown %s after the claim, past the block-after limit: not re-sent", cl.Age.Round(time.Second))
		return out, c.write(ctx, nil, &out, func(wctx context.Context) error {
			_, err := sess.BlockClaims(wctx, orders, ids, out.Detail)
			return err
		})
	}
	sends := c.Sends.withDefaults()
	deadline := sends.deadline() // before the record: SPEC §11 I5
	pending, err := markSent(ctx, sess, c.dbTimeout(), sends, orders, ids, []string{cmp.Or(c.Sender, SenderCompleter)})
	if err != nil {
		return out, fmt.Errorf("completer: settle order %d: %w", cl.OrderID, err)
	}
	bctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	defer cancel()
	tx, err := sess.Begin(bctx)
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
		err = c.write(ctx, tx, &out, func(wctx context.Context) error {
			_, err := tx.BlockClaims(wctx, orders, ids, out.Detail)
			return err
		})
	default: // EffectRecordUnknown
		out.Result, out.Detail = string(ClaimPending), err.Error()
		err = c.write(ctx, tx, &out, func(wctx context.Context) error {
			return tx.RecordUnknown(wctx, cl.OrderID, cl.EventID, out.Detail, c.parkedBackoff())
		})
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
func (c *Completer) writeCharged(ctx context.Context, tx Tx, out *Settled, chargeID string) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.dbTimeout())
	defer cancel()
	at := c.Now()
	marked, err := tx.MarkCharged(wctx, []int64{out.OrderID}, []uuid.UUID{out.EventID}, []string{chargeID}, at)
	if err != nil {
		return fmt.Errorf("completer: record order %d as charged: %w", out.OrderID, err)
	}
	if len(marked) == 1 {
		return c.commitAndLog(ctx, wctx, tx, out)
	}
	sc, err := recordStray(wctx, tx, StrayRecord{OrderID: out.OrderID, CustomerID: out.CustomerID, EventID: out.EventID, Amount: out.Amount,
		ChargeID: chargeID, Sender: cmp.Or(c.Sender, SenderCompleter), Host: c.Sends.Host, ChargedAt: at})
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

// write runs the statement that records what settle did to out's claim,
// on a context that outlives ctx (the provider's answer must be kept),
// commits tx when it is not nil (the statement ran in it), and logs it.
func (c *Completer) write(ctx context.Context, tx Tx, out *Settled, statement func(context.Context) error) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.dbTimeout())
	defer cancel()
	if err := statement(wctx); err != nil {
		return fmt.Errorf("completer: record order %d as %s: %w", out.OrderID, out.Result, err)
	}
	return c.commitAndLog(ctx, wctx, tx, out)
}

// commitAndLog commits tx on wctx when it is not nil, and logs what
// settle did to out's claim.
func (c *Completer) commitAndLog(ctx, wctx context.Context, tx Tx, out *Settled) error {
	if tx != nil {
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
