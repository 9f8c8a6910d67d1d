package billing

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/dedup"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// Batcher bills events that arrive at the same time together: one
// multi-row claim statement, committed before any charge, then one charge
// transaction with the multi-row processed_event insert, the charges in
// parallel, one multi-row record and one commit. Every event keeps its own
// Idempotency-Key, body and outcome, so the guarantees of Process hold per
// event; what a batch saves is round trips, fsyncs and connections.
//
// A failed charge fails its own event only; the others are recorded. When
// the charge transaction fails after the charges, every claim stays
// pending, so no failure of a batch can lose one: each event's retry
// re-sends its own request and the provider replays its stored answer.
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
	linger      time.Duration
}

type request struct {
	ctx  context.Context
	ev   events.OrderConfirmed
	done chan response
}

// NewBatcher returns a Batcher over svc running at most maxInFlight
// batches of at most maxBatch events; a batch formed while others are in
// flight waits up to linger to fill. observe, when not nil, sees the size
// of every batch. Call Close when done.
func NewBatcher(svc *Service, maxBatch, maxInFlight int, linger time.Duration, observe func(size int)) *Batcher {
	b := &Batcher{
		svc: svc, maxBatch: max(1, maxBatch),
		queue: make(chan request), slots: make(chan struct{}, max(1, maxInFlight)),
		stop: make(chan struct{}), batchSizeFn: observe, linger: linger,
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
		batch := b.gather(first)
		if b.batchSizeFn != nil {
			b.batchSizeFn(len(batch))
		}
		b.wg.Go(func() {
			defer func() { <-b.slots }()
			b.run(batch)
		})
	}
}

// gather takes what is queued behind first, up to maxBatch. While other
// batches are in flight (the service is busy), it waits up to linger for
// more: a batch of one costs a claim commit and a charge commit for one
// event, a batch of 32 the same two for 32. An idle service sends at once.
func (b *Batcher) gather(first request) []request {
	batch := []request{first}
	var timeout <-chan time.Time
	for len(batch) < b.maxBatch {
		select {
		case r := <-b.queue:
			batch = append(batch, r)
			continue
		default:
		}
		if timeout == nil {
			if b.linger <= 0 || len(b.slots) < 2 {
				return batch
			}
			t := time.NewTimer(b.linger)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case r := <-b.queue:
			batch = append(batch, r)
		case <-timeout:
			return batch
		case <-b.stop:
			return batch
		}
	}
	return batch
}

// run bills one batch and answers every request in it.
func (b *Batcher) run(batch []request) {
	ctx, cancel := allDone(batch)
	defer cancel()
	evs, attempts := make([]events.OrderConfirmed, len(batch)), make([]*attempt, len(batch))
	for i, r := range batch {
		evs[i], attempts[i] = r.ev, attemptOf(r.ctx)
	}
	for i, r := range b.svc.processAll(ctx, evs, attempts) {
		batch[i].done <- r
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

// processAll bills evs together: one claim statement for all of them,
// then one charge transaction for those to charge, and answers each event,
// in order. An event outside the processed_event partitions makes
// the charge phase fall back to one transaction per event, each deciding
// alone whether it needs the ledger alone.
//
// attempts[i] is the attempt batch[i] belongs to (see WithAttempt).
func (s *Service) processAll(ctx context.Context, batch []events.OrderConfirmed, attempts []*attempt) []response {
	out := make([]response, len(batch))
	// The same event twice in one batch (a redelivery beside its
	// original): the later copy waits for the earlier one's outcome.
	var evs []events.OrderConfirmed
	var tokens []uuid.UUID
	var atts []*attempt
	var at []int // batch index of each of evs
	seen := map[uuid.UUID]bool{}
	for i, ev := range batch {
		if seen[ev.EventID] {
			out[i].err = fault.Errorf(fault.Busy, "event %s is being billed by another delivery", ev.EventID)
			continue
		}
		seen[ev.EventID] = true
		evs, tokens, at = append(evs, ev), append(tokens, attempts[i].id), append(at, i)
		atts = append(atts, attempts[i])
	}
	var toCharge []events.OrderConfirmed
	var created []bool
	var chargeAtts []*attempt
	var chargeAt []int
	for k, c := range s.claimAll(ctx, evs, tokens) {
		if !c.charge {
			out[at[k]] = response{c.res, c.err}
			continue
		}
		toCharge, chargeAt = append(toCharge, evs[k]), append(chargeAt, at[k])
		created, chargeAtts = append(created, c.created && !atts[k].unknown.Load()), append(chargeAtts, atts[k])
	}
	if len(toCharge) == 0 {
		return out
	}
	charged, err := s.chargeAll(ctx, toCharge, created, chargeAtts, true)
	switch {
	case errors.Is(err, dedup.ErrNoPartition):
		var wg sync.WaitGroup
		for k, ev := range toCharge {
			wg.Go(func() {
				res, err := s.charge(ctx, ev, created[k], chargeAtts[k], true)
				if errors.Is(err, dedup.ErrNoPartition) {
					s.logger.WarnContext(ctx, "event outside dedup partitions, ledger decides", "event_id", ev.EventID, "order_id", ev.OrderID)
					res, err = s.charge(ctx, ev, created[k], chargeAtts[k], false)
					res.DedupBypassed = true
				}
				out[chargeAt[k]] = response{res, err}
			})
		}
		wg.Wait()
	case err != nil:
		for _, i := range chargeAt {
			out[i].err = err
		}
	default:
		for k, r := range charged {
			out[chargeAt[k]] = r
		}
	}
	return out
}
