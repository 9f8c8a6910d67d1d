package billing

import "github.com/billing-consumer/billing-consumer/internal/elastic"

// workers is a pool of goroutines that run the charges of a batch in
// parallel (internal/elastic: they start as the charges need them, up to
// the pool's size, and those not needed for elastic.Idle end).
//
// A nil *workers has no worker: every job gets a goroutine of its own.
type workers struct{ pool *elastic.Pool[func()] }

// newWorkers returns a pool of at most n workers. Call close when no more
// jobs come.
func newWorkers(n int) *workers {
	return &workers{pool: elastic.New(n, func(f func()) { f() }, func(f func()) bool { return f == nil })}
}

// run runs f on an idle worker, on a new one when none is idle and the
// pool is not full, or else on a goroutine of its own: it never waits, so
// that no charge of a batch waits for another's answer.
func (w *workers) run(f func()) {
	if w == nil || !w.pool.TryRun(f) {
		go f()
	}
}

// close stops the workers once their jobs are done. No run may follow.
func (w *workers) close() { w.pool.Close() }
