package elastic

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestTryRunReusesIdleWorkersAndNeverExceedsTheSize: a full pool refuses
// a job instead of waiting; a finished worker takes the next job instead
// of a new one being started; Close waits for the jobs to finish.
func TestTryRunReusesIdleWorkersAndNeverExceedsTheSize(t *testing.T) {
	var ran atomic.Int32
	p := New(1, func(f func()) { f(); ran.Add(1) })
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
