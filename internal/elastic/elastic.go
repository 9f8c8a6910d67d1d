// Package elastic is a pool of worker goroutines that grows with the work
// and shrinks back. A worker keeps its stack from one job to the next (a
// goroutine per job would grow its stack into the billing, HTTP and JSON
// call chains again every time), so a busy service keeps its workers; one
// that stays idle for Idle (up to twice that) ends, so an idle service
// holds none.
//
// A job goes to an idle worker first: a send on Jobs (unbuffered)
// succeeds only while a worker waits for one. Only when none is idle does
// the caller take one of the pool's slots (a send on Slots, which holds a
// token per live worker) and Spawn a new worker for it. Callers select on
// both channels directly, with their own cases beside them; TryRun is the
// same without waiting.
package elastic

import (
	"sync"
	"time"
)

// Idle is how long a worker waits for its next job before it ends.
const Idle = 5 * time.Second

// Pool runs jobs of type T on at most its size of workers.
type Pool[T any] struct {
	Jobs  chan T        // to the idle workers
	Slots chan struct{} // a token per live worker
	do    func(T)
	wg    sync.WaitGroup
}

// New returns a pool of at most n workers, each running do for its jobs.
// Call Close when no more jobs come.
func New[T any](n int, do func(T)) *Pool[T] {
	return &Pool[T]{Jobs: make(chan T), Slots: make(chan struct{}, max(n, 0)), do: do}
}

// Spawn starts a worker for j; the caller holds a slot for it (it sent on
// Slots), which the worker frees when it ends. The worker runs j, then
// whatever Jobs hands it, until none comes for between Idle and twice
// that, or the pool closes. (Its idle timer is re-armed only when it
// fires, not after every job: a reset per job was a timer operation per
// event on a busy service.)
func (p *Pool[T]) Spawn(j T) {
	p.wg.Go(func() {
		defer func() { <-p.Slots }()
		idle := time.NewTimer(Idle)
		defer idle.Stop()
		p.do(j)
		worked := true // since the timer was armed
		for {
			select {
			case j, ok := <-p.Jobs:
				if !ok {
					return
				}
				p.do(j)
				worked = true
			case <-idle.C:
				if !worked {
					return
				}
				worked = false
				idle.Reset(Idle)
			}
		}
	})
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
	close(p.Jobs)
	p.wg.Wait()
}
