// Package elastic is a pool of worker goroutines that grows with the work
// and shrinks back. A worker keeps its stack from one job to the next (a
// goroutine per job would grow its stack into the billing, HTTP and JSON
// call chains again every time), so a busy service keeps its workers; the
// ones it did not need for a whole Idle period end, so an idle service
// holds none.
//
// A job goes to an idle worker first: a send on Jobs (unbuffered)
// succeeds only while a worker waits for one. Only when none is idle does
// the caller take one of the pool's slots (a send on Slots, which holds a
// token per live worker) and Spawn a new worker for it. Callers select on
// both channels directly, with their own cases beside them; TryRun is the
// same without waiting.
//
// An idle worker waits with a plain receive on Jobs, not a select beside
// a timer: on a busy service that receive is a hand-off per event, and a
// two-case select cost about three times the receive's CPU (1.4 µs per
// event over the consumer's and the biller's pools, in the bench's CPU
// profiles). Retiring is the pool's own loop's job instead (retire).
package elastic

import (
	"sync"
	"sync/atomic"
	"time"
)

// Idle is the period of the pool's retire loop: the workers the pool had
// to spare all through one period (idle at every moment of it) end at its
// close, so a worker the service no longer needs lives on for between
// Idle and twice that.
const Idle = 5 * time.Second

// Pool runs jobs of type T on at most its size of workers.
type Pool[T any] struct {
	Jobs  chan T        // to the idle workers
	Slots chan struct{} // a token per live worker
	do    func(T)
	// none reports whether a job is the zero job, which callers never
	// send: retire sends it to end an idle worker.
	none func(T) bool
	// idle is the number of workers waiting on Jobs; fewest is the
	// lowest it fell to since retire last looked.
	idle, fewest atomic.Int32
	stop         chan struct{} // closed by Close: retire returns
	retired      chan struct{} // closed by retire when it returns
	wg           sync.WaitGroup
}

// New returns a pool of at most n workers, each running do for its jobs.
// none reports whether a job is T's zero value (a nil func, a struct
// whose pointer is nil): callers never hand that one over. Call Close
// when no more jobs come.
func New[T any](n int, do func(T), none func(T) bool) *Pool[T] {
	return newPool(n, do, none, Idle)
}

// newPool is New with the idle period given (tests).
func newPool[T any](n int, do func(T), none func(T) bool, idle time.Duration) *Pool[T] {
	p := &Pool[T]{Jobs: make(chan T), Slots: make(chan struct{}, max(n, 0)), do: do, none: none,
		stop: make(chan struct{}), retired: make(chan struct{})}
	go p.retire(idle)
	return p
}

// Spawn starts a worker for j; the caller holds a slot for it (it sent on
// Slots), which the worker frees when it ends. The worker runs j, then
// whatever Jobs hands it, until it is handed the zero job (retire) or the
// pool closes.
func (p *Pool[T]) Spawn(j T) {
	p.wg.Go(func() {
		defer func() { <-p.Slots }()
		for {
			p.do(j)
			p.idle.Add(1)
			var ok bool
			j, ok = <-p.Jobs
			p.lower(p.idle.Add(-1))
			if !ok || p.none(j) {
				return
			}
		}
	})
}

// lower lowers fewest to n unless it is lower already.
func (p *Pool[T]) lower(n int32) {
	for {
		f := p.fewest.Load()
		if n >= f || p.fewest.CompareAndSwap(f, n) {
			return
		}
	}
}

// retire ends, once every idle period, as many idle workers as were idle
// all through the period (the fewest waiting at any moment of it): the
// service did not need them. Channels hand jobs to waiting receivers in
// turn, so no one worker need have been idle all along; the count says
// how many the pool had to spare.
func (p *Pool[T]) retire(idle time.Duration) {
	defer close(p.retired)
	tick := time.NewTicker(idle)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		spare := p.fewest.Swap(p.idle.Load())
		// A worker that took a job between the Load and the Swap lowered
		// the old count, not the new one.
		p.lower(p.idle.Load())
		p.end(spare)
	}
}

// end hands the zero job to up to n idle workers, which end; it stops at
// the first send no worker waits for.
func (p *Pool[T]) end(n int32) {
	var zero T
	for range n {
		select {
		case p.Jobs <- zero:
		default:
			return
		}
	}
}

// TryRun runs j on an idle worker, or on a new one when none is idle and
// the pool is not full; it reports false, having run nothing, when
// neither is possible. It never waits.
func (p *Pool[T]) TryRun(j T) bool {
	select {
	case p.Jobs <- j:
		return true
	default:
	}
	select {
	case p.Slots <- struct{}{}:
		p.Spawn(j)
		return true
	default:
		return false
	}
}

// Close ends the workers once their jobs are done and waits for them. No
// job may be handed over after it.
func (p *Pool[T]) Close() {
	close(p.stop)
	<-p.retired
	close(p.Jobs)
	p.wg.Wait()
}
