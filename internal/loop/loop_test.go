package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/logtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// start runs l in a goroutine; the returned function cancels it and waits
// (bounded) for Run to return.
func start(t *testing.T, l Loop, logger *slog.Logger) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx, logger) }()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

// counter counts passes and hands each one's error from errs (nil once
// they run out).
type counter struct {
	mu   sync.Mutex
	n    int
	errs []error
}

func (c *counter) pass(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if len(c.errs) == 0 {
		return nil
	}
	err := c.errs[0]
	c.errs = c.errs[1:]
	return err
}

func (c *counter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestRunPassesAtOnceThenEveryIntervalUntilCancelled(t *testing.T) {
	var c counter
	var doneCalls int
	stop := start(t, Loop{Interval: 10 * time.Millisecond, RunOnce: c.pass, Done: func(context.Context) { doneCalls++ }}, discard())
	poll.Until(t, 10*time.Second, "three passes", func() bool { return c.count() >= 3 })
	stop()
	n := c.count()
	time.Sleep(30 * time.Millisecond) // nothing may run after Run returned
	if c.count() != n || doneCalls != 1 {
		t.Errorf("after Run returned: passes %d then %d, Done called %d times, want no pass and Done once", n, c.count(), doneCalls)
	}
}

func TestWaitDelaysTheFirstPass(t *testing.T) {
	var c counter
	start(t, Loop{Interval: time.Hour, Wait: true, RunOnce: c.pass}, discard())
	var d counter
	start(t, Loop{Interval: time.Hour, RunOnce: d.pass}, discard())
	poll.Until(t, 10*time.Second, "the plain loop's first pass", func() bool { return d.count() == 1 })
	if c.count() != 0 {
		t.Errorf("a Wait loop made %d passes before its first interval", c.count())
	}
}

func TestErrStopEndsTheLoop(t *testing.T) {
	c := counter{errs: []error{errors.New("transient"), fmt.Errorf("refused: %w", ErrStop)}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Loop{Interval: time.Millisecond, RunOnce: c.pass}.Run(context.Background(), discard())
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on after a pass returned ErrStop")
	}
	if c.count() != 2 {
		t.Errorf("%d passes, want 2", c.count())
	}
}

// Failed passes are logged each (the default), at most once per Every, or
// when their error changes (OnChange); a success between forgets the
// last error.
func TestFailedPassesAreLoggedAsTheLoopSays(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	tests := []struct {
		name string
		how  Log
		errs []error
		want int // lines
	}{
		{"each", Log{}, []error{a, a, b}, 3},
		{"every hour", Log{Every: time.Hour}, []error{a, b, nil, a}, 1},
		{"on change", Log{OnChange: true}, []error{a, a, b, b, nil, b}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf logtest.Buffer
			logger := slog.New(slog.NewTextHandler(&buf, nil))
			tt.how.Level, tt.how.Msg, tt.how.Args = slog.LevelWarn, "pass failed", []any{"group", "g"}
			c := counter{errs: tt.errs}
			stop := start(t, Loop{Interval: time.Millisecond, RunOnce: c.pass, Failed: tt.how}, logger)
			poll.Until(t, 10*time.Second, "every error handed out", func() bool { return c.count() > len(tt.errs) })
			stop()
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if len(lines) != tt.want || !strings.Contains(lines[0], `level=WARN msg="pass failed" group=g err=a`) {
				t.Errorf("logged %d lines, want %d with the message, args and err:\n%s", len(lines), tt.want, buf.String())
			}
		})
	}
}

// A pass bounded by Timeout sees its context end, and Stopping tells that
// apart from the loop's own context ending.
func TestTimeoutBoundsAPassAndStoppingTellsWhy(t *testing.T) {
	got := make(chan bool, 10)
	pass := func(ctx context.Context) error {
		<-ctx.Done()
		select {
		case got <- Stopping(ctx):
		default:
		}
		return ctx.Err()
	}
	stop := start(t, Loop{Interval: time.Hour, Timeout: 10 * time.Millisecond, RunOnce: pass}, discard())
	select {
	case s := <-got:
		if s {
			t.Error("Stopping is true for a pass that ran out of its Timeout")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pass was not bounded by Timeout")
	}
	stop()

	started := make(chan struct{})
	stop = start(t, Loop{Interval: time.Hour, Timeout: time.Hour, RunOnce: func(ctx context.Context) error {
		close(started)
		return pass(ctx)
	}}, discard())
	<-started
	stop()
	if s := <-got; !s {
		t.Error("Stopping is false for a pass whose loop was cancelled")
	}
}
