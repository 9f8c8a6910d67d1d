// Package poll is how tests wait for a condition that another goroutine
// or process makes true: by asking again until it holds or a deadline
// passes, never by sleeping a fixed time and hoping. Every loop it runs is
// bounded.
package poll

import (
	"testing"
	"time"
)

// Until calls cond until it returns true. When timeout passes first it
// fails t with Fatalf, naming what it waited for, so it must be called
// from the test's goroutine. Between calls it sleeps 1 ms, doubling up to
// 50 ms: a condition that comes true at once costs little, a long wait
// does not spin.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}
