package pipeline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
)

// testGate is a Config.Gate an operator's pause closes and a resume
// opens, as pause.Watcher's; it counts how often it was asked while
// paused, so that a test sees a sender waiting on it.
type testGate struct {
	mu          sync.Mutex
	open        chan struct{} // closed while not paused
	askedPaused int
}

func newTestGate() *testGate {
	g := &testGate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *testGate) gate() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isPausedLocked() {
		return g.open
	}
	g.askedPaused++
	return g.open
}

func (g *testGate) isPausedLocked() bool {
	select {
	case <-g.open:
		return false
	default:
		return true
	}
}

func (g *testGate) paused() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.isPausedLocked() }

func (g *testGate) pause() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isPausedLocked() {
		g.open = make(chan struct{})
	}
}

func (g *testGate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.isPausedLocked() {
		close(g.open)
	}
}

func (g *testGate) asked() int { g.mu.Lock(); defer g.mu.Unlock(); return g.askedPaused }

// A record already handed out when the pause comes is not retried while
// paused (SPEC §11 I4) and is retried after the resume. The wait spends
// nothing: the fake clock moves an hour during the pause, beyond the
// retry budget (15 min) and the outage limit (30 s), yet the event's next
// transient failure neither exhausts it nor is taken for an outage; the
// service stays ready while paused.
func TestRetryWaitsForTheResume(t *testing.T) {
	clock := newFakeClock()
	g := newTestGate()
	msg, _ := validRecord(t)
	var duringPause []int
	var mu sync.Mutex
	biller := &fakeBiller{process: func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
		if g.paused() {
			mu.Lock()
			duringPause = append(duringPause, call)
			mu.Unlock()
		}
		switch call {
		case 1: // the pause commits while this request is in flight; it finishes
			g.pause()
			return billing.Result{}, errTransient
		case 2:
			return billing.Result{}, errTransient
		}
		return billing.Result{Outcome: billing.Charged}, nil
	}}
	env := newEnv(t, biller, nil, func(c *Config) {
		budgetPolicy(clock, 30*time.Second, 10)(c)
		c.MaxAttempts, c.Gate = 2, g.gate
	})
	done := make(chan error, 1)
	go func() { done <- env.h.Handle(context.Background(), msg) }()
	deadline := time.After(10 * time.Second)
	for waiting := false; !waiting; {
		select {
		case err := <-done:
			t.Fatalf("Handle = %v with the pause in force; calls made while paused: %v; want the retry to wait for the resume", err, duringPause)
		case <-deadline:
			t.Fatal("the handler did not wait on the gate within 10 s")
		case <-time.After(time.Millisecond):
			waiting = g.asked() > 0
		}
	}
	if env.h.Stalled() {
		t.Fatal("Stalled while paused; want ready: a pause is an operator's, not a failure")
	}
	clock.Add(time.Hour)
	g.resume()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Handle = %v; want the record committable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Handle did not finish within 10 s of the resume")
	}
	if len(duringPause) != 0 || len(biller.calls()) != 3 {
		t.Fatalf("calls %d, made while paused %v; want 3, none while paused (the first was in flight as the pause came)", len(biller.calls()), duringPause)
	}
	diffCounters(t, env.counters(t), map[string]float64{eventsKey("charged"): 1, retriesKey("transient"): 2})
}

// The Biller may itself find the pause (billing.ErrPaused: it came after
// the handler's check, nothing was sent): the event waits for the resume
// like any paused retry, counted as nothing.
func TestBillerFindsThePause(t *testing.T) {
	g := newTestGate()
	msg, _ := validRecord(t)
	biller := &fakeBiller{process: func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
		if call == 1 {
			g.pause()
			return billing.Result{}, billing.ErrPaused
		}
		if g.paused() {
			return billing.Result{}, errors.New("sent while paused")
		}
		return billing.Result{Outcome: billing.Charged}, nil
	}}
	env := newEnv(t, biller, nil, func(c *Config) { c.Gate = g.gate })
	done := make(chan error, 1)
	go func() { done <- env.h.Handle(context.Background(), msg) }()
	for deadline := time.Now().Add(10 * time.Second); g.asked() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the handler did not wait on the gate within 10 s (%d calls)", len(biller.calls()))
		}
	}
	g.resume()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Handle = %v; want the record committable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Handle did not finish within 10 s of the resume")
	}
	if n := len(biller.calls()); n != 2 {
		t.Fatalf("%d calls; want 2 (the paused one, then the charge)", n)
	}
	diffCounters(t, env.counters(t), map[string]float64{eventsKey("charged"): 1})
}

// The deciding loop checks the pause before each decision, not once per
// pass (SPEC §11 I4): a pause that comes during the first decision stops
// the pass there, the other due events untouched; when the Biller finds
// the pause itself (billing.ErrPaused), the row is given back at once
// (nothing was decided) and the pass stops too.
func TestDecideDeferredStopsAtThePause(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer error
	}{
		{"pause during a decision", nil},
		{"biller finds the pause", billing.ErrPaused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newTestGate()
			var rows []fakeRow
			for i := range 3 {
				msg, id := validRecord(t)
				rows = append(rows, fakeRow{Deferred: billing.Deferred{EventID: id, OrderID: int64(1001 + i), Record: recordOf(msg)}})
			}
			deferrer := &fakeDeferrer{rows: rows}
			biller := &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				g.pause()
				if tc.answer != nil {
					return billing.Result{}, tc.answer
				}
				return billing.Result{Outcome: billing.Charged}, nil
			}}
			env := newEnv(t, biller, nil, func(c *Config) {
				c.ParkAfter, c.Parker, c.Deferrer, c.Gate = 30*time.Second, &fakeParker{}, deferrer, g.gate
			})
			if err := env.h.DecideDeferred(context.Background()); err != nil {
				t.Fatalf("DecideDeferred = %v; want a pass stopped by the pause, not failed", err)
			}
			if n := len(biller.calls()); n != 1 {
				t.Fatalf("%d decisions; want 1: the pass must stop at the pause", n)
			}
			untaken := 0
			for _, r := range deferrer.rows {
				if !r.leased {
					untaken++
				}
			}
			if untaken != 2 {
				t.Fatalf("%d rows left untaken; want 2", untaken)
			}
			if tc.answer != nil {
				if len(deferrer.finished) != 0 || deferrer.retried[1001] != 0 || len(deferrer.retried) != 1 {
					t.Fatalf("finished %d, retried %v; want the row given back at once, not finished", len(deferrer.finished), deferrer.retried)
				}
			}
		})
	}
}
