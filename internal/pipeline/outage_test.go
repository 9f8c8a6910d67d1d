package pipeline

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// TestOutageIsNotPoison: the provider fails every call for a while. Once
// OutageThreshold distinct events have failed in a row, the failures stop
// spending attempts: no event reaches the DLQ, and all are charged when the
// provider comes back. The handler reports itself stalled meanwhile.
func TestOutageIsNotPoison(t *testing.T) {
	const n, maxAttempts = 6, 2
	var down atomic.Bool
	down.Store(true)
	// Every event fails once before any is retried, as n events in flight
	// at once would; and every event's first failure has been counted
	// before any retry is answered. Without the second barrier, a loaded
	// machine let an early event fail its MaxAttempts before the others'
	// first failures made the outage, and dead-lettered it (CI saw this).
	var firstCalls, secondCalls sync.WaitGroup
	firstCalls.Add(n)
	secondCalls.Add(n)
	var biller *fakeBiller
	biller = &fakeBiller{process: func(ctx context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
		// An event's calls are made one after another, this one included.
		switch callsOf(biller, ev.EventID) {
		case 1:
			firstCalls.Done()
			firstCalls.Wait()
		case 2:
			secondCalls.Done()
			secondCalls.Wait()
		}
		if down.Load() {
			return billing.Result{}, fault.New(fault.Transient, errors.New("provider answered 503"))
		}
		return billing.Result{Outcome: billing.Charged}, nil
	}}
	env := newEnv(t, biller, nil, func(c *Config) {
		c.OutageThreshold = 3
		c.MaxAttempts = maxAttempts
	})
	errs := make(chan error, n)
	ids := make([]uuid.UUID, n)
	for i := range n {
		msg, id := validRecord(t)
		ids[i] = id
		go func() { errs <- env.h.Handle(context.Background(), msg) }()
	}
	poll.Until(t, 10*time.Second, "the handler to report the outage", env.h.Stalled)
	// Every event tried well past MaxAttempts during the outage, none
	// dead-lettered: the retries spent nothing.
	poll.Until(t, 10*time.Second, "every event to be tried 5 times more than MaxAttempts", func() bool {
		for _, id := range ids {
			if callsOf(biller, id) < maxAttempts+5 {
				return false
			}
		}
		return true
	})
	down.Store(false)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if calls := env.dlq.calls(); len(calls) != 0 {
		t.Fatalf("%d healthy events dead-lettered during an outage", len(calls))
	}
	if got := env.counters(t)[eventsKey("charged")]; got != n {
		t.Fatalf("charged %v, want %d", got, n)
	}
	if env.h.Stalled() {
		t.Fatal("still stalled after the outage")
	}
}

// TestPoisonEventStillExhausts: one event failing transiently on its own
// is not an outage, however often it fails: it is dead-lettered as
// exhausted after MaxAttempts, and the events around it are charged.
func TestPoisonEventStillExhausts(t *testing.T) {
	poison, poisonID := validRecord(t)
	biller := &fakeBiller{process: func(ctx context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
		if ev.EventID == poisonID {
			return billing.Result{}, fault.New(fault.Transient, errors.New("provider answered 500 for this order"))
		}
		return billing.Result{Outcome: billing.Charged}, nil
	}}
	env := newEnv(t, biller, nil, func(c *Config) { c.OutageThreshold = 2 })
	for i := range 3 {
		msg := poison
		if i != 1 {
			msg, _ = validRecord(t)
		}
		if err := env.h.Handle(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	calls := env.dlq.calls()
	if len(calls) != 1 || calls[0].reason != "exhausted" || calls[0].attempts != testMaxAttempts {
		t.Fatalf("DLQ calls %+v; want the poison event exhausted after %d attempts", calls, testMaxAttempts)
	}
}

// Only events failing at their first attempt count towards
// OutageThreshold: the retries of orders the provider keeps failing, which
// at any rate land a few at a time between two batches' successes, are
// not an outage (the bench's failing row saw "dependency outage (10 events
// failing, no success for 78ms)" and ~1,300 systemic pauses in one healthy
// drain before), while fresh events failing in a row still are.
func TestOnlyFirstAttemptsMakeAnOutage(t *testing.T) {
	env := newEnv(t, &fakeBiller{}, nil, func(c *Config) { c.OutageThreshold, c.OutageAfter = 3, time.Hour })
	now := time.Now()
	var evs []events.OrderConfirmed
	for range 3 {
		msg, _ := validRecord(t)
		ev, err := events.Decode(msg.Value, now)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	for _, ev := range evs {
		if why := env.h.outage(ev, now, false); why != "" {
			t.Fatalf("retries of events already failing: %q; want no outage", why)
		}
	}
	for i, ev := range evs {
		why := env.h.outage(ev, now, true)
		if (why != "") != (i == 2) {
			t.Fatalf("first attempt %d failing in a row: outage %q; want one at the third", i+1, why)
		}
	}
	env.h.recovered()
	if why := env.h.outage(evs[0], now, true); why != "" {
		t.Fatalf("after a success: %q; want the streak begun anew", why)
	}
}
