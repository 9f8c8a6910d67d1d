package poll

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as testing.T's does.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// until runs Until on a recorder in its own goroutine and returns what it
// failed with ("" when it returned).
func until(timeout time.Duration, cond func() bool) string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(r, timeout, "the flag", cond)
	}()
	<-done
	return r.msg
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	if msg := until(10*time.Second, func() bool { calls++; return calls == 3 }); msg != "" || calls != 3 {
		t.Fatalf("Until failed with %q after %d calls; want it to return after 3", msg, calls)
	}
}

func TestUntilFailsAtTheDeadline(t *testing.T) {
	calls := 0
	msg := until(30*time.Millisecond, func() bool { calls++; return false })
	if !strings.Contains(msg, "timed out after 30ms waiting for the flag") || calls < 2 {
		t.Fatalf("Until = %q after %d calls; want a timeout naming what it waited for", msg, calls)
	}
}
