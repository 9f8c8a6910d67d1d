package billing

import (
	"sync"
	"time"
)

// workers is a pool of goroutines that run the charges of a batch in
// parallel. A goroutine per charge would start small and grow its stack
// into the HTTP client's call chain again for every charge; a worker keeps
// its stack from one charge to the next. Workers start as the charges need
// them, up to the pool's size, and end after workerIdle without a charge:
// a busy service keeps them, an idle one holds none.
//
// A nil *workers has no worker: every job gets a goroutine of its own.
type workers struct {
	jobs  chan func()   // to the idle workers
	slots chan struct{} // a token per live worker
	wg    sync.WaitGroup
}

// workerIdle is how long a worker waits for its next charge before it
// ends.
const workerIdle = 5 * time.Second

// newWorkers returns a pool of at most n workers. Call close when no more
// jobs come.
func newWorkers(n int) *workers {
	return &workers{jobs: make(chan func()), slots: make(chan struct{}, max(n, 0))}
}

// run runs f on an idle worker, on a new one when none is idle and the
// pool is not full, or else on a goroutine of its own: it never waits, so
// that no charge of a batch waits for another's answer.
func (w *workers) run(f func()) {
	if w != nil {
		select {
		case w.jobs <- f:
			return
		default:
		}
		select {
		case w.slots <- struct{}{}:
			w.wg.Go(func() { w.work(f) })
			return
		default:
		}
	}
	go f()
}

// work runs f and then whatever idle workers are given, until none comes
// for workerIdle or the pool closes.
func (w *workers) work(f func()) {
	defer func() { <-w.slots }()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		var ok bool
		select {
		case f, ok = <-w.jobs:
			if !ok {
				return
			}
		case <-idle.C:
			return
		}
	}
}

// close stops the workers once their jobs are done. No run may follow.
func (w *workers) close() {
	close(w.jobs)
	w.wg.Wait()
}
