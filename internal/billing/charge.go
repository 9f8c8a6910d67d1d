package billing

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/dedup"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// recordSQL marks claims charged. It matches on the owning event, whatever
// the status: a 2xx for the claim's key is the truth about the money, even
// when the completer blocked the claim meanwhile.
const recordSQL = `UPDATE charge AS c SET provider_charge_id = v.id, charged_at = $4, status = 'charged'
FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS v(o, e, id) WHERE c.order_id = v.o AND c.event_id = v.e`

// holdSQL locks the claims of events that did not create them (an earlier
// attempt of the same event did) FOR KEY SHARE in the charge transaction,
// before their requests are sent, and returns those still pending. The
// creating attempt may release its claim on a definite refusal meanwhile
// (its request refused by something that stores nothing under the key: a
// gateway's 404, a validation 400); a release committed before the hold
// leaves no row, and a later release waits for the transaction's end and
// then finds the claim charged. Without it, an attempt that saw its own
// pending claim would send the request after the release and the provider
// could take money for an order no claim holds. KEY SHARE does not stop
// the completer's updates of the status.
const holdSQL = `SELECT c.event_id FROM charge AS c JOIN unnest($1::bigint[], $2::uuid[]) AS v(o, e)
ON c.order_id = v.o AND c.event_id = v.e WHERE c.status = 'pending' ORDER BY c.order_id FOR KEY SHARE OF c`

// response is the answer for one event.
type response struct {
	res Result
	err error
}

// charge charges the claimed ev in one transaction for attempt att;
// created says whether att created the claim and may still release it.
func (s *Service) charge(ctx context.Context, ev events.OrderConfirmed, created bool, att *attempt, withDedup bool) (Result, error) {
	out, err := s.chargeAll(ctx, []events.OrderConfirmed{ev}, []bool{created}, []*attempt{att}, withDedup, nil)
	if err != nil {
		return Result{}, err
	}
	return out[0].res, out[0].err
}

// chargeAll is the charge phase for events whose orders they have claimed
// (distinct event ids): one transaction with the processed_event rows
// (unless withDedup is false), the charges in parallel (on pool, nil for
// one event), the claims of the charged events marked 'charged', one
// COMMIT. A failed charge fails its own event only.
//
// Its error means that nothing was recorded or sent: dedup.ErrNoPartition
// (wrapped) when an event falls outside the processed_event partitions, or
// a failure to begin. Otherwise it answers each event, in order; an event
// the provider charged but whose record did not commit gets a Transient
// error, its claim still pending: the retry gets the provider's stored
// answer.
//
// atts[i] is evs[i]'s attempt: a request sent without a definite answer
// marks it unknown, so that none of its later refusals releases the claim.
func (s *Service) chargeAll(ctx context.Context, evs []events.OrderConfirmed, created []bool, atts []*attempt, withDedup bool, pool *workers) ([]response, error) {
	bctx, cancel := s.live(ctx)
	tx, err := s.db.Begin(bctx)
	cancel()
	if err != nil {
		return nil, classifyDB(fmt.Errorf("begin: %w", err))
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
	out := make([]response, len(evs))
	todo := make([]int, 0, len(evs))
	if withDedup {
		isFresh, err := s.markProcessed(ctx, tx, evs)
		if err != nil {
			return nil, err
		}
		for i, ev := range evs {
			if isFresh[ev.EventID] {
				todo = append(todo, i)
			} else {
				out[i].res.Outcome = Duplicate
			}
		}
	} else {
		for i := range evs {
			todo = append(todo, i)
		}
	}
	send, err := s.hold(ctx, tx, evs, created, todo, out)
	if err != nil {
		return nil, err
	}
	s.sendAll(ctx, evs, send, out, pool)

	var charged, failed []int
	for _, i := range todo {
		if out[i].err != nil {
			failed = append(failed, i)
		} else {
			charged = append(charged, i)
		}
	}
	if len(charged) > 0 {
		if err := s.record(ctx, tx, evs, out, charged, failed, withDedup); err != nil {
			for _, i := range charged {
				out[i] = response{err: fault.New(fault.KindOf(err), fmt.Errorf(
					"order %d was charged, but recording it failed (the claim stays pending; the retry replays): %w", evs[i].OrderID, err))}
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
	s.settleFailed(ctx, evs, created, failed, out)
	return out, nil
}

// markProcessed inserts the processed_event rows of evs in tx and returns
// which are new.
func (s *Service) markProcessed(ctx context.Context, tx pgx.Tx, evs []events.OrderConfirmed) (map[uuid.UUID]bool, error) {
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		ids[i] = ev.EventID
	}
	mctx, cancel := s.live(ctx)
	defer cancel()
	fresh, err := dedup.MarkProcessed(mctx, tx, ids, s.group, s.now())
	if errors.Is(err, dedup.ErrNoPartition) {
		return nil, err
	}
	if err != nil {
		return nil, classifyDB(err)
	}
	isFresh := make(map[uuid.UUID]bool, len(fresh))
	for _, id := range fresh {
		isFresh[id] = true
	}
	return isFresh, nil
}

// hold locks, with holdSQL, the claims of the events of todo that this
// attempt did not create, and returns the events of todo to send: those
// that created their claim, and those whose claim is still pending. The
// others get a Transient error (nothing sent; their retry decides again
// from the ledger). Its error, in tx, means that nothing was sent.
func (s *Service) hold(ctx context.Context, tx pgx.Tx, evs []events.OrderConfirmed, created []bool, todo []int, out []response) ([]int, error) {
	var orders []int64
	var ids [][16]byte // binary uuids (see claimOnce)
	for _, i := range todo {
		if !created[i] {
			orders, ids = append(orders, evs[i].OrderID), append(ids, evs[i].EventID)
		}
	}
	if len(orders) == 0 {
		return todo, nil
	}
	hctx, cancel := s.live(ctx)
	defer cancel()
	rows, err := tx.Query(hctx, holdSQL, orders, ids)
	if err != nil {
		return nil, classifyDB(fmt.Errorf("hold %d claims: %w", len(orders), err))
	}
	held, err := dedup.CollectUUIDs(rows)
	if err != nil {
		return nil, classifyDB(fmt.Errorf("hold %d claims: %w", len(orders), err))
	}
	isHeld := make(map[uuid.UUID]bool, len(held))
	for _, id := range held {
		isHeld[id] = true
	}
	send := make([]int, 0, len(todo))
	for _, i := range todo {
		if created[i] || isHeld[evs[i].EventID] {
			send = append(send, i)
			continue
		}
		out[i].err = fault.Errorf(fault.Transient, "order %d: the claim of event %s was released or settled before its request was sent; nothing sent, deciding again",
			evs[i].OrderID, evs[i].EventID)
	}
	return send, nil
}

// sendAll charges evs[idx] concurrently and fills in out once every
// charge has answered: the first on this goroutine, the others on pool.
func (s *Service) sendAll(ctx context.Context, evs []events.OrderConfirmed, idx []int, out []response, pool *workers) {
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

// record marks the charged events' claims charged, removes the failed
// events' processed_event rows and commits tx, all on a context that
// outlives ctx: the provider took money, so the ledger must say so even
// when a shutdown cancels ctx meanwhile.
func (s *Service) record(ctx context.Context, tx pgx.Tx, evs []events.OrderConfirmed, out []response, charged, failed []int, withDedup bool) error {
	wctx, cancel := s.detached(ctx)
	defer cancel()
	orders, ids, chargeIDs := make([]int64, len(charged)), make([][16]byte, len(charged)), make([]string, len(charged))
	for k, i := range charged {
		orders[k], ids[k], chargeIDs[k] = evs[i].OrderID, evs[i].EventID, out[i].res.ChargeID
	}
	tag, err := tx.Exec(wctx, recordSQL, orders, ids, chargeIDs, s.now())
	if err != nil {
		return classifyDB(fmt.Errorf("record %d charges: %w", len(charged), err))
	}
	if int(tag.RowsAffected()) != len(charged) {
		// Impossible while claims are released only by their creator on a
		// definite refusal and every other attempt holds its claim (hold):
		// the provider took money for a claim that is gone.
		return fault.Errorf(fault.Conflict, "recorded %d of %d charges: a ledger claim vanished while its charge was taken", tag.RowsAffected(), len(charged))
	}
	if withDedup && len(failed) > 0 {
		unmark := make([]uuid.UUID, len(failed))
		for k, i := range failed {
			unmark[k] = evs[i].EventID
		}
		if err := dedup.Unmark(wctx, tx, unmark, s.group); err != nil {
			return classifyDB(err)
		}
	}
	if err := tx.Commit(wctx); err != nil {
		return classifyDB(fmt.Errorf("commit %d charges: %w", len(charged), err))
	}
	return nil
}

// definiteRefusal reports whether a charge error proves that the provider
// did not take the money: the Charger's error says so with a NotTaken
// method (*payment.Error: a refusal of the charge, of our credentials, or
// a request never sent).
func definiteRefusal(err error) bool {
	var nt interface{ NotTaken() bool }
	return errors.As(err, &nt) && nt.NotTaken()
}

// settleFailed gives the events whose charge failed their ledger outcome
// (see settleRefused) and logs what a kept claim means.
func (s *Service) settleFailed(ctx context.Context, evs []events.OrderConfirmed, created []bool, failed []int, out []response) {
	var release, block []events.OrderConfirmed
	why := map[uuid.UUID]string{}
	for _, i := range failed {
		ev, err := evs[i], out[i].err
		switch k := fault.KindOf(err); {
		case k == fault.Conflict:
			block = append(block, ev)
			why[ev.EventID] = err.Error()
		case definiteRefusal(err) && created[i]:
			release = append(release, ev)
		case definiteRefusal(err):
			s.logger.WarnContext(ctx, "charge refused, but an earlier attempt created the claim: left pending for the completer",
				"order_id", ev.OrderID, "event_id", ev.EventID, "err", err)
		}
	}
	s.settleRefused(ctx, release, block, why)
}
