package billing

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/events"
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
// takes up to MaxBatch of them. Under load (see gather) a batch waits up
// to Linger to fill; an idle service bills every event at once, alone.
type Batcher struct {
	svc       *Service
	cfg       BatcherConfig
	queue     chan request
	slots     chan struct{}
	charges   *workers
	wg        sync.WaitGroup
	stop      chan struct{}
	closeOnce sync.Once
	// lastArrival is when the loop last took an event from the queue;
	// only the loop uses it.
	lastArrival time.Time
	timer       *time.Timer // the loop's linger timer, stopped when unused
}

// BatcherConfig shapes a Batcher.
type BatcherConfig struct {
	// MaxBatch is the most events in one batch (BILLING_BATCH_SIZE).
	MaxBatch int
	// MaxInFlight is the most batches running at once, each holding a
	// database connection.
	MaxInFlight int
	// Linger is the longest a batch waits to fill under load
	// (BILLING_BATCH_LINGER); 0 never waits.
	Linger time.Duration
	// Callers is the most Process calls that can be under way at once
	// (BILLING_CONCURRENCY); 0 means unknown. A batch never holds more
	// (it could only wait for events that cannot come): with 1, the
	// sequential mode, every batch is full with its first event and
	// nothing ever waits.
	Callers int
	// Observe, when not nil, sees the size of every batch.
	Observe func(size int)
}

type request struct {
	ctx  context.Context
	ev   events.OrderConfirmed
	done chan response
}

// NewBatcher returns a Batcher over svc shaped by cfg, with a pool of
// long-lived workers for the charges of its batches, as many as there can
// be charges at once. Call Close when done.
func NewBatcher(svc *Service, cfg BatcherConfig) *Batcher {
	cfg.MaxBatch, cfg.MaxInFlight = max(1, cfg.MaxBatch), max(1, cfg.MaxInFlight)
	if cfg.Callers > 0 {
		cfg.MaxBatch = min(cfg.MaxBatch, cfg.Callers)
	}
	// The first charge of a batch runs on the batch's own goroutine.
	n := cfg.MaxBatch*cfg.MaxInFlight - cfg.MaxInFlight
	if cfg.Callers > 0 {
		n = min(n, cfg.Callers)
	}
	b := &Batcher{
		svc: svc, cfg: cfg, queue: make(chan request), slots: make(chan struct{}, cfg.MaxInFlight),
		charges: newWorkers(n), stop: make(chan struct{}), timer: time.NewTimer(time.Hour),
	}
	b.timer.Stop()
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

// Close stops accepting events, waits for the running batches and stops
// the charge workers. It may be called again: a later call returns once
// the first has finished.
func (b *Batcher) Close() {
	b.closeOnce.Do(func() {
		close(b.stop)
		b.wg.Wait()
		b.charges.close()
	})
}

func (b *Batcher) loop() {
	for {
		var first request
		select {
		case first = <-b.queue:
		case <-b.stop:
			return
		}
		now := time.Now()
		busy := len(b.slots) > 0 || now.Sub(b.lastArrival) < b.cfg.Linger
		b.lastArrival = now
		select { // wait for a slot; requests queue meanwhile
		case b.slots <- struct{}{}:
		case <-b.stop:
			first.done <- response{err: errors.New("billing batcher closed")}
			return
		}
		batch := b.gather(first, busy)
		if b.cfg.Observe != nil {
			b.cfg.Observe(len(batch))
		}
		b.wg.Go(func() {
			defer func() { <-b.slots }()
			b.run(batch)
		})
	}
}

// gather takes what is queued behind first, up to MaxBatch. When the
// service is busy (another batch was in flight, or another event arrived
// less than Linger before first: a connection just freed under load) it
// waits up to Linger for more, until the batch is full. A batch of one
// costs five round trips and two commits for one event, a batch of 32 the
// same for 32. An idle service sends at once.
func (b *Batcher) gather(first request, busy bool) []request {
	batch := make([]request, 1, b.cfg.MaxBatch)
	batch[0] = first
	lingering := false
	defer func() {
		if lingering {
			b.timer.Stop()
		}
	}()
	for len(batch) < b.cfg.MaxBatch {
		select {
		case r := <-b.queue:
			batch = append(batch, r)
			b.lastArrival = time.Now()
			continue
		default:
		}
		if !busy || b.cfg.Linger <= 0 {
			return batch
		}
		if !lingering {
			lingering = true
			b.timer.Reset(b.cfg.Linger)
		}
		select {
		case r := <-b.queue:
			batch = append(batch, r)
			b.lastArrival = time.Now()
		case <-b.timer.C:
			lingering = false
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
	for i, r := range b.svc.processAll(ctx, evs, attempts, b.charges) {
		batch[i].done <- r
	}
}

// allDone returns a context that ends when every request's context has
// ended: one event's partition being revoked must not abort the others'
// charges. It watches each distinct Done channel once: the events of one
// partition share theirs (the partition's context), and every watch is an
// entry in that context's children, a map that keeps the largest size it
// reached for as long as the partition is owned (4 MB of the live heap at
// 160 partitions, one watch per event).
func allDone(batch []request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	var watch []context.Context // one per distinct Done channel
	for _, r := range batch {
		d := r.ctx.Done()
		if !slices.ContainsFunc(watch, func(w context.Context) bool { return w.Done() == d }) {
			watch = append(watch, r.ctx)
		}
	}
	var mu sync.Mutex
	left := len(watch)
	stops := make([]func() bool, 0, len(watch))
	for _, w := range watch {
		stops = append(stops, context.AfterFunc(w, func() {
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
