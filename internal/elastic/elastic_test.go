package elastic

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTryRunReusesIdleWorkersAndNeverExceedsTheSize: a full pool refuses
// a job instead of waiting; a finished worker takes the next job instead
// of a new one being started; Close waits for the jobs to finish.
func TestTryRunReusesIdleWorkersAndNeverExceedsTheSize(t *testing.T) {
	var ran atomic.Int32
	p := New(1, func(f func()) { f(); ran.Add(1) }, func(f func()) bool { return f == nil })
	release := make(chan struct{})
	if !p.TryRun(func() { <-release }) {
		t.Fatal("an empty pool refused a job")
	}
	if p.TryRun(func() {}) {
		t.Fatal("a pool of one busy worker took a second job")
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for !p.TryRun(func() {}) { // the worker, idle again, takes it
		if time.Now().After(deadline) {
			t.Fatal("the idle worker never took the next job")
		}
		time.Sleep(time.Millisecond)
	}
	if n := len(p.Slots); n != 1 {
		t.Errorf("%d live workers, want the one reused", n)
	}
	p.Close()
	if n := ran.Load(); n != 2 {
		t.Errorf("%d jobs ran by Close, want 2", n)
	}
	if n := len(p.Slots); n != 0 {
		t.Errorf("%d slots held after Close, want 0", n)
	}
}

// TestWorkersTheServiceDidNotNeedEnd: of three workers, the two idle all
// through a period end and the busy one stays; once its job is done it
// ends too, and Close still works.
func TestWorkersTheServiceDidNotNeedEnd(t *testing.T) {
	p := newPool(4, func(f func()) { f() }, func(f func()) bool { return f == nil }, 20*time.Millisecond)
	defer p.Close()
	var holds [3]chan struct{}
	for k := range holds {
		holds[k] = make(chan struct{})
		if !p.TryRun(func() { <-holds[k] }) {
			t.Fatal("a pool of four refused a third job")
		}
	}
	close(holds[0])
	close(holds[1])
	waitWorkers(t, p, 1)
	close(holds[2])
	waitWorkers(t, p, 0)
}

// TestAWorkerInUseIsKept: a worker handed a job every millisecond is never
// idle for a whole period, so every job runs on the same goroutine.
func TestAWorkerInUseIsKept(t *testing.T) {
	const period = 500 * time.Millisecond
	var mu sync.Mutex
	ran := map[string]bool{}
	p := newPool(4, func(f func()) { f() }, func(f func()) bool { return f == nil }, period)
	defer p.Close()
	for end := time.Now().Add(4 * period); time.Now().Before(end); time.Sleep(time.Millisecond) {
		done := make(chan struct{})
		if !p.TryRun(func() {
			buf := make([]byte, 64)
			id, _, _ := strings.Cut(string(buf[:runtime.Stack(buf, false)]), " [")
			mu.Lock()
			ran[id] = true
			mu.Unlock()
			close(done)
		}) {
			t.Fatal("the pool refused a job")
		}
		<-done
	}
	if len(ran) != 1 {
		t.Errorf("jobs ran on %d goroutines, want 1: a worker in use was ended", len(ran))
	}
}

// waitWorkers polls, for up to 5 s, until p has n live workers.
func waitWorkers[T any](t *testing.T, p *Pool[T], n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(p.Slots) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d live workers after 5 s, want %d", len(p.Slots), n)
		}
	}
}
