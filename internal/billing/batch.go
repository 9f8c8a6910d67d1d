package billing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
)

// Batcher bills events that arrive at the same time in one transaction:
// one multi-row processed_event insert, one multi-row ledger claim, the
// charges in parallel, one multi-row update and one commit. Every event
// keeps its own Idempotency-Key and body, so the guarantees of Process hold
// per event; what a batch saves is round trips, fsyncs and connections
// (one per batch, not one per event).
//
// A failed charge fails its own event only, settled as Process settles it
// (a charge of unknown outcome leaves the order claimed, 'pending'); the
// others are recorded and committed. When the batch's SQL fails (a
// deadlock, an event outside the dedup partitions) the transaction rolls
// back before any charge, or after them only if recording fails, and each
// event is billed again on its own with Process; a charge taken before
// such a rollback is replayed by the provider on the retry, same key.
//
// Events queue while MaxInFlight batches are running, and the next batch
// takes up to MaxBatch of them: under light load every event runs at once,
// alone; under heavy load the batches grow.
type Batcher struct {
	svc         *Service
	maxBatch    int
	queue       chan request
	slots       chan struct{}
	wg          sync.WaitGroup
	stop        chan struct{}
	stopOnce    sync.Once
	batchSizeFn func(int) // observes batch sizes; may be nil
}

type request struct {
	ctx  context.Context
	ev   events.OrderConfirmed
	done chan response
}

type response struct {
	res Result
	err error
}

// NewBatcher returns a Batcher over svc running at most maxInFlight
// batches of at most maxBatch events. observe, when not nil, sees the size
// of every batch. Call Close when done.
func NewBatcher(svc *Service, maxBatch, maxInFlight int, observe func(size int)) *Batcher {
	b := &Batcher{
		svc: svc, maxBatch: max(1, maxBatch),
		queue: make(chan request), slots: make(chan struct{}, max(1, maxInFlight)),
		stop: make(chan struct{}), batchSizeFn: observe,
	}
	b.wg.Go(b.loop)
	return b
}

// Process bills ev, batched with whatever else is waiting. It returns what
// Service.Process would return for ev alone. Safe for concurrent use.
func (b *Batcher) Process(ctx context.Context, ev events.OrderConfirmed) (Result, error) {
	r := request{ctx: ctx, ev: ev, done: make(chan response, 1)}
	select {
	case b.queue <- r:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-b.stop:
		return Result{}, errors.New("billing batcher closed")
	}
	// The batch runs to its end even if ctx ends meanwhile (its
	// transaction is bounded by the contexts of all its events), so the
	// answer always comes.
	resp := <-r.done
	return resp.res, resp.err
}

// Close stops accepting events and waits for the running batches.
func (b *Batcher) Close() {
	b.stopOnce.Do(func() { close(b.stop) })
	b.wg.Wait()
}

func (b *Batcher) loop() {
	for {
		var first request
		select {
		case first = <-b.queue:
		case <-b.stop:
			return
		}
		select { // wait for a slot; requests queue meanwhile
		case b.slots <- struct{}{}:
		case <-b.stop:
			first.done <- response{err: errors.New("billing batcher closed")}
			return
		}
		batch := []request{first}
	gather:
		for len(batch) < b.maxBatch {
			select {
			case r := <-b.queue:
				batch = append(batch, r)
			default:
				break gather
			}
		}
		if b.batchSizeFn != nil {
			b.batchSizeFn(len(batch))
		}
		b.wg.Go(func() {
			defer func() { <-b.slots }()
			b.run(batch)
		})
	}
}

// run bills one batch and answers every request in it.
func (b *Batcher) run(batch []request) {
	if len(batch) == 1 {
		res, err := b.svc.Process(batch[0].ctx, batch[0].ev)
		batch[0].done <- response{res, err}
		return
	}
	ctx, cancel := allDone(batch)
	defer cancel()
	out, err := b.svc.processBatch(ctx, batch)
	if err != nil {
		// Fall back to one transaction per event, concurrently.
		var wg sync.WaitGroup
		for _, r := range batch {
			wg.Go(func() {
				res, err := b.svc.Process(r.ctx, r.ev)
				r.done <- response{res, err}
			})
		}
		wg.Wait()
		return
	}
	for i, r := range batch {
		r.done <- out[i]
	}
}

// allDone returns a context that ends when every request's context has
// ended: one event's partition being revoked must not abort the others'
// charges.
func allDone(batch []request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	left := len(batch)
	stops := make([]func() bool, 0, len(batch))
	for _, r := range batch {
		stops = append(stops, context.AfterFunc(r.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if left--; left == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}

const (
	batchMarkSQL = `INSERT INTO processed_event (event_id, consumer_group, processed_at)
SELECT id, $2, $3 FROM unnest($1::uuid[]) AS id ORDER BY id
ON CONFLICT DO NOTHING RETURNING event_id`
	batchClaimSQL = `INSERT INTO charge (order_id, event_id, customer_id, amount, charged_at, status)
SELECT o, e, c, a::numeric, $5, 'pending' FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::text[]) WITH ORDINALITY AS v(o, e, c, a, n)
ORDER BY o, n
ON CONFLICT DO NOTHING RETURNING order_id, event_id`
	batchExistingSQL = `SELECT order_id, event_id, customer_id, amount::text, status FROM charge WHERE order_id = ANY($1)`
	batchUnmarkSQL   = `DELETE FROM processed_event WHERE event_id = ANY($1) AND consumer_group = $2`
	batchReleaseSQL  = `DELETE FROM charge WHERE event_id = ANY($1) AND status = 'pending'`
	batchRecordSQL   = `UPDATE charge AS c SET provider_charge_id = v.id, charged_at = $3, status = 'charged'
FROM unnest($1::bigint[], $2::text[]) AS v(o, id) WHERE c.order_id = v.o`
)

// processBatch bills the batch in one transaction. Its error means nothing
// was recorded and every event must be billed again on its own; otherwise
// it answers each request, in order.
func (s *Service) processBatch(ctx context.Context, batch []request) ([]response, error) {
	out := make([]response, len(batch))
	err := withTx(ctx, s.db, func(tx pgx.Tx) error {
		clear(out)
		now := s.now()
		// 1. Dedup. The same event twice in one batch: the later one is a
		// duplicate of the earlier.
		ids := make([]uuid.UUID, 0, len(batch))
		firstOf := map[uuid.UUID]int{}
		for i, r := range batch {
			if _, seen := firstOf[r.ev.EventID]; seen {
				out[i].res.Outcome = Duplicate
				continue
			}
			firstOf[r.ev.EventID] = i
			ids = append(ids, r.ev.EventID)
		}
		rows, err := tx.Query(ctx, batchMarkSQL, ids, s.group, now)
		if err != nil {
			return err
		}
		fresh, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return err // a noPartition error included: the fallback sorts it out
		}
		isFresh := map[uuid.UUID]bool{}
		for _, id := range fresh {
			isFresh[id] = true
		}
		var claim []int // indexes of fresh events, to claim their orders
		for id, i := range firstOf {
			if isFresh[id] {
				claim = append(claim, i)
			} else {
				out[i].res.Outcome = Duplicate
			}
		}
		slices.Sort(claim)
		if len(claim) == 0 {
			return nil
		}
		// 2. Claim the orders, in order_id order (concurrent batches lock
		// ledger rows in the same order: no deadlock between them); of
		// two events for one order, the one queued first wins.
		orders, evIDs, customers, amounts := make([]int64, len(claim)), make([]uuid.UUID, len(claim)), make([]int64, len(claim)), make([]string, len(claim))
		for k, i := range claim {
			ev := batch[i].ev
			orders[k], evIDs[k], customers[k], amounts[k] = ev.OrderID, ev.EventID, ev.CustomerID, ev.TotalAmount.String()
		}
		rows, err = tx.Query(ctx, batchClaimSQL, orders, evIDs, customers, amounts, now)
		if err != nil {
			return err
		}
		claimedBy := map[uuid.UUID]bool{}
		for rows.Next() {
			var o int64
			var e uuid.UUID
			if err := rows.Scan(&o, &e); err != nil {
				rows.Close()
				return err
			}
			claimedBy[e] = true
		}
		if err := rows.Err(); err != nil {
			return err
		}
		var toCharge, lost []int
		for _, i := range claim {
			if claimedBy[batch[i].ev.EventID] {
				toCharge = append(toCharge, i)
			} else {
				lost = append(lost, i)
			}
		}
		// 3. Orders already charged (before, or by another event of this
		// batch): decide each like claimOrder does.
		var deferred []int
		if len(lost) > 0 {
			recharge, def, err := s.decideLost(ctx, tx, batch, lost, out, claimedBy)
			if err != nil {
				return err
			}
			toCharge, deferred = append(toCharge, recharge...), def
		}
		// 4. Charge in parallel. A failed charge fails its event alone:
		// the others' charges were taken and are recorded.
		s.chargeAll(ctx, batch, toCharge, out)
		claimant := map[int64]int{}
		for _, i := range toCharge {
			claimant[batch[i].ev.OrderID] = i
		}
		unmark := decideDeferred(batch, deferred, out, claimant)
		var ords []int64
		var chargeIDs []string
		var release []uuid.UUID
		for _, i := range toCharge {
			ev := batch[i].ev
			if err := out[i].err; err != nil {
				unmark = append(unmark, ev.EventID)
				if k := fault.KindOf(err); k == fault.Permanent || k == fault.Invalid {
					release = append(release, ev.EventID)
				}
				continue
			}
			ords, chargeIDs = append(ords, ev.OrderID), append(chargeIDs, out[i].res.ChargeID)
		}
		wctx := context.WithoutCancel(ctx) // record what was taken, even when ctx ended meanwhile
		if len(ords) > 0 {
			if _, err := tx.Exec(wctx, batchRecordSQL, ords, chargeIDs, s.now()); err != nil {
				return err
			}
		}
		if len(unmark) > 0 {
			if _, err := tx.Exec(wctx, batchUnmarkSQL, unmark, s.group); err != nil {
				return err
			}
		}
		if len(release) > 0 {
			if _, err := tx.Exec(wctx, batchReleaseSQL, release); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bill a batch of %d events: %w", len(batch), err)
	}
	return out, nil
}

// decideLost gives the events whose order was already in the ledger their
// outcome, and returns those whose own earlier charge is pending, to be
// charged again. The processed_event row of an event that fails here (a
// conflict, or an order pending by another event) is removed again, as
// the rollback of a lone event would have done, so that it can be retried
// or dead-lettered and, once fixed, replayed.
func (s *Service) decideLost(ctx context.Context, tx pgx.Tx, batch []request, lost []int, out []response, inBatch map[uuid.UUID]bool) (recharge, deferred []int, err error) {
	orders := make([]int64, len(lost))
	for k, i := range lost {
		orders[k] = batch[i].ev.OrderID
	}
	rows, err := tx.Query(ctx, batchExistingSQL, orders)
	if err != nil {
		return nil, nil, err
	}
	type row struct {
		event    uuid.UUID
		customer int64
		amount   string
		status   string
	}
	existing := map[int64]row{}
	for rows.Next() {
		var o int64
		var r row
		if err := rows.Scan(&o, &r.event, &r.customer, &r.amount, &r.status); err != nil {
			rows.Close()
			return nil, nil, err
		}
		existing[o] = r
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var conflicts []uuid.UUID
	for _, i := range lost {
		ev := batch[i].ev
		r, ok := existing[ev.OrderID]
		switch {
		case !ok:
			out[i].err = fault.Errorf(fault.Conflict, "event %s already charged a different order than %d", ev.EventID, ev.OrderID)
		case r.event == ev.EventID && r.status == "pending":
			recharge = append(recharge, i) // our own charge of unknown outcome: same key again
			continue
		case r.event == ev.EventID:
			out[i].res.Outcome = Duplicate
			continue
		case r.status == "pending" && inBatch[r.event]:
			deferred = append(deferred, i) // claimed by an event of this batch: decided after its charge
			continue
		case r.status == "pending":
			out[i].err = fault.Errorf(fault.Transient, "order %d has a charge of unknown outcome by event %s; waiting for it to settle", ev.OrderID, r.event)
		case r.amount != ev.TotalAmount.String() || r.customer != ev.CustomerID:
			out[i].err = fault.Errorf(fault.Conflict, "order %d already charged by event %s with other parameters", ev.OrderID, r.event)
		default:
			out[i].res.Outcome = DuplicateOrder
			continue
		}
		conflicts = append(conflicts, ev.EventID)
	}
	if len(conflicts) > 0 {
		if _, err := tx.Exec(ctx, batchUnmarkSQL, conflicts, s.group); err != nil {
			return nil, nil, err
		}
	}
	return recharge, deferred, nil
}

// decideDeferred settles the events whose order another event of the
// batch claimed, once that event's charge is known: a duplicate_order or
// a conflict if it charged, a transient failure (wait) if it did not. It
// returns the events whose processed_event row must go.
func decideDeferred(batch []request, deferred []int, out []response, claimant map[int64]int) []uuid.UUID {
	var unmark []uuid.UUID
	for _, i := range deferred {
		ev := batch[i].ev
		c := claimant[ev.OrderID]
		first := batch[c].ev
		switch {
		case out[c].err != nil:
			out[i].err = fault.Errorf(fault.Transient, "order %d: the charge by event %s failed; waiting for it to settle", ev.OrderID, first.EventID)
		case first.TotalAmount != ev.TotalAmount || first.CustomerID != ev.CustomerID:
			out[i].err = fault.Errorf(fault.Conflict, "order %d already charged by event %s with other parameters", ev.OrderID, first.EventID)
		default:
			out[i].res.Outcome = DuplicateOrder
			continue
		}
		unmark = append(unmark, ev.EventID)
	}
	return unmark
}

// chargeAll charges the claimed events concurrently and fills in their
// results or errors.
func (s *Service) chargeAll(ctx context.Context, batch []request, idx []int, out []response) {
	var wg sync.WaitGroup
	for _, i := range idx {
		wg.Go(func() {
			ev := batch[i].ev
			r, err := s.charger.Charge(ctx, payment.Charge{
				IdempotencyKey: ev.EventID.String(), OrderID: ev.OrderID,
				CustomerID: ev.CustomerID, Amount: ev.TotalAmount,
			})
			if err != nil {
				out[i].err = fmt.Errorf("charge order %d: %w", ev.OrderID, err)
				return
			}
			out[i].res = Result{Outcome: Charged, ChargeID: r.ChargeID}
		})
	}
	wg.Wait()
}
