package billing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// response is the answer for one event.
type response struct {
	res Result
	err error
}

// charge charges the claimed ev in one transaction for attempt att;
// created says whether att created the claim. Its send is recorded anew.
func (s *Service) charge(ctx context.Context, ev events.OrderConfirmed, created bool, att *attempt, withDedup bool) (Result, error) {
	out, err := s.chargeAll(ctx, []events.OrderConfirmed{ev}, []bool{created}, []bool{false}, s.sends.deadline(), []*attempt{att}, withDedup, nil)
	if err != nil {
		return Result{}, err
	}
	return out[0].res, out[0].err
}

// chargeAll is the charge phase for events whose orders they have claimed
// (distinct event ids). The events whose sends the claim statement did
// not record (recorded[i] false: a retry of the creator, or another
// attempt) first record that they send (markSent, committed on its own;
// SPEC §11 I5). No request is sent after deadline, which the caller fixed
// before any of the sends was recorded. Then one transaction: the processed_event rows (unless withDedup is
// false), the charges in parallel (on pool, nil for one event), the claims
// of the charged events marked 'charged', one COMMIT. Each step is the
// claim's transition function's (ClaimState.Next): the send (its pause
// row; the claim phase asked the rest: claimWon, decide), a 2xx's
// EffectMarkCharged (recordSQL, in record), and a failed charge, which
// fails its own event only, moving its claim (settleFailed).
//
// Its error means that nothing was recorded or sent: ErrNoPartition
// (wrapped) when an event falls outside the processed_event partitions, or
// a failure to record the sends or to begin. Otherwise it answers each
// event, in order; an event the provider charged but whose record did not
// commit gets a Transient error, its claim still pending: the retry gets
// the provider's stored answer.
//
// atts[i] is evs[i]'s attempt: a request sent without a definite answer
// marks it unknown, so that none of its later refusals releases the claim.
func (s *Service) chargeAll(ctx context.Context, evs []events.OrderConfirmed, created, recorded []bool, deadline time.Time, atts []*attempt, withDedup bool, pool *workers) ([]response, error) {
	out := make([]response, len(evs))
	mayCharge, err := s.recordSends(ctx, evs, created, recorded, out)
	if err != nil {
		return nil, err
	}
	bctx, cancel := s.live(ctx)
	tx, err := s.store.Begin(bctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	// The transaction ends before the failed events' claims are settled
	// (settleFailed), on other connections.
	done := false
	end := func() {
		if !done {
			done = true
			rctx, cancel := s.detached(ctx)
			defer cancel()
			_ = tx.Rollback(rctx)
		}
	}
	defer end()
	send, moved, err := s.prepare(ctx, tx, evs, created, mayCharge, withDedup, out)
	if err != nil {
		return nil, err
	}
	// The send decision's last question, where the requests leave
	// (pause.go): the pause, one for the whole batch (ClaimState.Next:
	// ErrPaused, nothing sent; the transaction rolls back).
	if _, _, err := ClaimPending.Next(ClaimInput{Actor: ActorCreator, Paused: s.paused()}); errors.Is(err, ErrPaused) {
		pausedAt(evs, send, out)
		return out, nil
	}
	s.sendAll(ctx, evs, send, deadline, out, pool)

	// Each answer moves the event's own claim as its transition function
	// says: a 2xx marks it charged (EffectMarkCharged: recordSQL, in
	// record); the failed ones are settleFailed's.
	var charged, failed []int
	for _, i := range send {
		in := ClaimInput{Actor: actorOf(created[i]), Answer: answerOf(out[i].err)}
		if _, effects, _ := ClaimPending.Next(in); slices.Contains(effects, EffectMarkCharged) {
			charged = append(charged, i)
		} else {
			failed = append(failed, i)
		}
	}
	if len(charged) > 0 {
		// The moved events' processed_event rows go with the failed ones'.
		if err := s.record(ctx, tx, evs, created, out, charged, append(moved, failed...), withDedup); err != nil {
			for _, i := range charged {
				if out[i].err == nil {
					out[i] = response{err: fault.New(fault.KindOf(err), fmt.Errorf(
						"order %d was charged, but recording it failed (the claim stays pending; the retry replays): %w", evs[i].OrderID, err))}
				}
			}
		} else {
			done = true
		}
	}
	end()
	for _, i := range send {
		if out[i].err != nil && !definiteRefusal(out[i].err) {
			atts[i].unknown.Store(true)
		}
	}
	s.settleFailed(ctx, evs, created, atts, failed, out)
	return out, nil
}

// prepare is the charge transaction's work before the requests: the
// processed_event rows of the events that may be charged (idx; unless
// withDedup is false), then the hold of the claims of those that did not
// create them. It returns the events to send and those whose claim moved
// before the hold (errMovedMeanwhile in out, nothing sent: their
// processed_event rows must be removed again). The duplicates get their
// outcome in out. Its error, in tx, means that nothing was sent.
func (s *Service) prepare(ctx context.Context, tx Tx, evs []events.OrderConfirmed, created []bool, idx []int, withDedup bool, out []response) (send, moved []int, err error) {
	send = idx
	if withDedup && len(idx) > 0 {
		isFresh, err := s.markProcessed(ctx, tx, evs, idx)
		if err != nil {
			return nil, nil, err
		}
		send = make([]int, 0, len(idx))
		for _, i := range idx {
			if isFresh[evs[i].EventID] {
				send = append(send, i)
			} else {
				out[i].res.Outcome = Duplicate
			}
		}
	}
	return s.hold(ctx, tx, evs, created, send, out)
}

// hold locks (holdSQL), until tx ends, the claims of the events of idx
// that did not create them, and returns the events of idx to send and
// those whose claim is no longer pending (see prepare). markSent has
// already made sure that no creator of this binary releases such a claim;
// the hold keeps a binary built before others_sent_at existed, which
// releases on a refusal without looking at it, from deleting the claim
// under a request in flight while both run during an upgrade.
func (s *Service) hold(ctx context.Context, tx Tx, evs []events.OrderConfirmed, created []bool, idx []int, out []response) (send, moved []int, err error) {
	var orders []int64
	var ids []uuid.UUID
	for _, i := range idx {
		if !created[i] {
			orders, ids = append(orders, evs[i].OrderID), append(ids, evs[i].EventID)
		}
	}
	if len(orders) == 0 {
		return idx, nil, nil
	}
	held, err := holdClaims(ctx, tx, s.dbTimeout, orders, ids)
	if err != nil {
		return nil, nil, err
	}
	send = make([]int, 0, len(idx))
	for _, i := range idx {
		if created[i] || held[evs[i].EventID] {
			send = append(send, i)
			continue
		}
		out[i].err = fault.New(fault.Transient, fmt.Errorf("order %d: %w", evs[i].OrderID, errMovedMeanwhile))
		moved = append(moved, i)
	}
	return send, moved, nil
}

// holdClaims holds the claims in tx (Tx.HoldClaims); the charge path and
// the completer share it.
func holdClaims(ctx context.Context, tx Tx, timeout time.Duration, orders []int64, ids []uuid.UUID) (map[uuid.UUID]bool, error) {
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	held, err := tx.HoldClaims(hctx, orders, ids)
	if err != nil {
		return nil, err
	}
	return idSet(held), nil
}

// markProcessed inserts the processed_event rows of evs[idx] in tx and
// returns which are new.
func (s *Service) markProcessed(ctx context.Context, tx Tx, evs []events.OrderConfirmed, idx []int) (map[uuid.UUID]bool, error) {
	ids := make([]uuid.UUID, len(idx))
	for k, i := range idx {
		ids[k] = evs[i].EventID
	}
	mctx, cancel := s.live(ctx)
	defer cancel()
	fresh, err := tx.MarkProcessed(mctx, ids, s.group, s.now())
	if err != nil {
		return nil, err
	}
	return idSet(fresh), nil
}

// sendAll charges evs[idx] concurrently and fills in out once every
// charge has answered: the first on this goroutine, the others on pool.
// No request leaves after deadline (the Charger's context ends then).
func (s *Service) sendAll(ctx context.Context, evs []events.OrderConfirmed, idx []int, deadline time.Time, out []response, pool *workers) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	send := func(i int) {
		r, err := s.charger.Charge(ctx, chargeOf(evs[i]))
		if err != nil {
			out[i].err = fmt.Errorf("charge order %d: %w", evs[i].OrderID, err)
			return
		}
		out[i].res = Result{Outcome: Charged, ChargeID: r.ChargeID}
	}
	if len(idx) == 0 {
		return
	}
	var wg sync.WaitGroup
	wg.Add(len(idx) - 1)
	for _, i := range idx[1:] {
		pool.run(func() {
			defer wg.Done()
			send(i)
		})
	}
	send(idx[0])
	wg.Wait()
}

// record marks the charged events' claims charged (EffectMarkCharged), removes the failed
// events' processed_event rows and commits tx, all on a context that
// outlives ctx: the provider took money, so the ledger must say so even
// when a shutdown cancels ctx meanwhile. A charged event whose claim is
// gone or another event's (only an operator, a foreign binary or a
// provider past its bound makes one) is a stray charge: recorded in tx
// with the rest (recordStray, the 2xx rule), its outcome charged all the
// same. Its error is the transaction's: nothing of it committed.
func (s *Service) record(ctx context.Context, tx Tx, evs []events.OrderConfirmed, created []bool, out []response, charged, failed []int, withDedup bool) error {
	wctx, cancel := s.detached(ctx)
	defer cancel()
	at := s.now()
	orders, ids, chargeIDs := make([]int64, len(charged)), make([]uuid.UUID, len(charged)), make([]string, len(charged))
	for k, i := range byOrder(evs, charged) {
		orders[k], ids[k], chargeIDs[k] = evs[i].OrderID, evs[i].EventID, out[i].res.ChargeID
	}
	marked, err := tx.MarkCharged(wctx, orders, ids, chargeIDs, at)
	if err != nil {
		return fmt.Errorf("record %d charges: %w", len(charged), err)
	}
	var strays []StrayCharge
	if len(marked) != len(charged) {
		isMarked := idSet(marked)
		for _, i := range byOrder(evs, charged) {
			if isMarked[evs[i].EventID] {
				continue
			}
			ev, sender := evs[i], SenderRedelivery
			if created[i] {
				sender = SenderCreator
			}
			sc, err := recordStray(wctx, tx, StrayRecord{OrderID: ev.OrderID, CustomerID: ev.CustomerID, EventID: ev.EventID, Amount: ev.TotalAmount,
				ChargeID: out[i].res.ChargeID, Sender: sender, Host: s.sends.Host, ChargedAt: at})
			if err != nil {
				return err
			}
			strays = append(strays, sc)
		}
	}
	if withDedup && len(failed) > 0 {
		unmark := make([]uuid.UUID, 0, len(failed))
		for _, i := range failed {
			unmark = append(unmark, evs[i].EventID)
		}
		if err := tx.Unmark(wctx, unmark, s.group); err != nil {
			return err
		}
	}
	if err := tx.Commit(wctx); err != nil {
		return fmt.Errorf("commit %d charges: %w", len(charged), err)
	}
	for _, sc := range strays {
		logStray(ctx, s.logger, sc)
	}
	return nil
}

// settleFailed carries out, for the claims of the events whose charge
// failed, the effects of the claim's transition (ClaimState.Next: release,
// block, or nothing) and logs what a kept claim means.
func (s *Service) settleFailed(ctx context.Context, evs []events.OrderConfirmed, created []bool, atts []*attempt, failed []int, out []response) {
	var release []events.OrderConfirmed
	var tokens []uuid.UUID
	for _, i := range failed {
		ev, err := evs[i], out[i].err
		// The claim is this event's own and unsettled as far as this
		// attempt knows; the statements' guards check it on the row.
		_, effects, _ := ClaimPending.Next(ClaimInput{Answer: answerOf(err), Actor: actorOf(created[i]), UnknownSeen: atts[i].unknown.Load()})
		switch {
		case slices.Contains(effects, EffectBlock):
			s.block(ctx, []events.OrderConfirmed{ev}, err.Error())
		case slices.Contains(effects, EffectRelease):
			release, tokens = append(release, ev), append(tokens, atts[i].id)
		default:
			if definiteRefusal(err) {
				s.logger.WarnContext(ctx, "charge refused, but this attempt may not release the claim: left pending for the completer",
					"order_id", ev.OrderID, "event_id", ev.EventID, "err", err)
			}
		}
	}
	released := s.release(ctx, release, tokens)
	for _, ev := range release {
		if !released[ev.EventID] {
			s.logger.WarnContext(ctx, "charge refused, but another attempt has sent the claim's request: left pending for the completer",
				"order_id", ev.OrderID, "event_id", ev.EventID)
		}
	}
}
