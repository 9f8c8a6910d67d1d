package billing

import "sync"

// workers is a pool of long-lived goroutines that run the charges of a
// batch in parallel. A goroutine per charge would start small and grow
// its stack into the HTTP client's call chain again for every charge; a
// worker keeps its stack from one charge to the next.
//
// A nil *workers has no worker: every job gets a goroutine of its own.
type workers struct {
	jobs chan func()
	wg   sync.WaitGroup
}

// newWorkers starts n workers. Call close when no more jobs come.
func newWorkers(n int) *workers {
	w := &workers{jobs: make(chan func())}
	for range n {
		w.wg.Go(func() {
			for f := range w.jobs {
				f()
			}
		})
	}
	return w
}

// run runs f on an idle worker, or on a goroutine of its own when every
// worker is busy: it never waits, so that no charge of a batch waits for
// another's answer.
func (w *workers) run(f func()) {
	if w != nil {
		select {
		case w.jobs <- f:
			return
		default:
		}
	}
	go f()
}

// close stops the workers once their jobs are done. No run may follow.
func (w *workers) close() {
	close(w.jobs)
	w.wg.Wait()
}
