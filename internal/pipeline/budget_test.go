package pipeline

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// budgetPolicy is the retry policy of these tests, on clock: at least 3
// attempts and a 15-minute budget; an outage after outageAfter or
// threshold distinct events.
func budgetPolicy(clock *fakeClock, outageAfter time.Duration, threshold int) func(*Config) {
	return func(c *Config) {
		c.Now = clock.Now
		c.MaxAttempts = 3
		c.RetryBudget = 15 * time.Minute
		c.OutageAfter = outageAfter
		c.OutageThreshold = threshold
	}
}

var errBusy = fault.New(fault.Busy, errors.New("order 1001 is claimed by another event, outcome unknown"))

// TestRetryBudgetWhileOthersSucceed: an event the provider keeps failing
// while other events are charged is dead-lettered as exhausted only once
// it has failed for RetryBudget, however many attempts that takes. The
// fake clock moves a minute per attempt.
func TestRetryBudgetWhileOthersSucceed(t *testing.T) {
	clock := newFakeClock()
	poison, poisonID := validRecord(t)
	var env *testEnv
	biller := &fakeBiller{process: func(ctx context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
		if ev.EventID != poisonID {
			return billing.Result{Outcome: billing.Charged}, nil
		}
		// Meanwhile an event of another partition is charged.
		other, _ := validRecord(t)
		if err := env.h.Handle(ctx, other); err != nil {
			t.Errorf("other event: %v", err)
		}
		clock.Add(time.Minute)
		return billing.Result{}, errTransient
	}}
	env = newEnv(t, biller, nil, budgetPolicy(clock, 5*time.Minute, 2))
	start := clock.Now()
	if err := env.h.Handle(context.Background(), poison); err != nil {
		t.Fatal(err)
	}
	// The first failure is at +1m; the budget is spent at the 16th, at
	// +16m, fifteen minutes of failing later.
	calls := env.dlq.calls()
	if len(calls) != 1 || calls[0].reason != "exhausted" || calls[0].attempts != 16 {
		for _, c := range calls {
			t.Logf("DLQ: %s after %d attempts", c.reason, c.attempts)
		}
		t.Fatalf("%d DLQ calls; want the poison event exhausted after 16 attempts", len(calls))
	}
	if elapsed := clock.Now().Sub(start); elapsed != 16*time.Minute {
		t.Errorf("exhausted %v after the first attempt, want 16m", elapsed)
	}
	diffCounters(t, env.counters(t), map[string]float64{
		eventsKey("charged"): 16, eventsKey("dlq"): 1, dlqKey("exhausted"): 1, retriesKey("transient"): 15,
	})
}

// TestLoneFailingEventPausesInsteadOfExhausting: at low traffic one event
// failing, with no success anywhere for OutageAfter, is an outage: the
// event pauses (unready) instead of spending its budget, however long the
// outage lasts. A success elsewhere ends the streak and the event's
// retries count again, from what it had spent before the pause.
func TestLoneFailingEventPausesInsteadOfExhausting(t *testing.T) {
	clock := newFakeClock()
	msg, id := validRecord(t)
	var down atomic.Bool
	down.Store(true)
	biller := &fakeBiller{process: func(_ context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
		if ev.EventID != id || !down.Load() {
			return billing.Result{Outcome: billing.Charged}, nil
		}
		clock.Add(10 * time.Second)
		return billing.Result{}, errTransient
	}}
	env := newEnv(t, biller, nil, budgetPolicy(clock, time.Minute, 10))
	done := make(chan error, 1)
	go func() { done <- env.h.Handle(context.Background(), msg) }()

	poll.Until(t, 10*time.Second, "the lone failing event to pause", env.h.Stalled)
	// 200 attempts are 33 minutes of the fake clock: twice the budget.
	poll.Until(t, 10*time.Second, "200 attempts", func() bool { return callsOf(biller, id) >= 200 })
	if calls := env.dlq.calls(); len(calls) != 0 {
		t.Fatalf("dead-lettered during an outage: %+v", calls)
	}
	if !env.h.Stalled() {
		t.Fatal("not stalled during the outage")
	}

	// Another event is charged: the streak ends, the event's failures
	// count again. Had the pause spent its budget, the next one would
	// exhaust it; it pauses again after another minute instead.
	other, _ := validRecord(t)
	if err := env.h.Handle(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	from := callsOf(biller, id)
	poll.Until(t, 10*time.Second, "30 more attempts", func() bool { return callsOf(biller, id) >= from+30 })
	if calls := env.dlq.calls(); len(calls) != 0 {
		t.Fatalf("dead-lettered after the streak restarted: %+v", calls)
	}
	poll.Until(t, 10*time.Second, "the event to pause again", env.h.Stalled)

	down.Store(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if env.h.Stalled() {
		t.Error("still stalled after the event was charged")
	}
	if got := env.counters(t)[eventsKey("charged")]; got != 2 {
		t.Errorf("charged %v, want 2", got)
	}
}

// TestBusyWaitsWithoutSpendingOrStalling: an event whose order is claimed
// by another event with an unknown outcome waits, hours if need be: no
// attempts or budget spent, no outage detected (OutageThreshold 1 would
// call any failure one), never unready.
func TestBusyWaitsWithoutSpendingOrStalling(t *testing.T) {
	clock := newFakeClock()
	msg, _ := validRecord(t)
	var stalledSeen atomic.Bool
	var env *testEnv
	biller := &fakeBiller{process: func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
		if env.h.Stalled() {
			stalledSeen.Store(true)
		}
		if call > 50 {
			return billing.Result{Outcome: billing.Charged}, nil
		}
		clock.Add(5 * time.Minute)
		return billing.Result{}, errBusy
	}}
	env = newEnv(t, biller, nil, budgetPolicy(clock, time.Minute, 1))
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	if stalledSeen.Load() || env.h.Stalled() {
		t.Error("unready while waiting for another event's claim")
	}
	diffCounters(t, env.counters(t), map[string]float64{
		eventsKey("charged"): 1, retriesKey("busy"): 50,
	})
}

// TestBusyNeitherEndsNorExtendsAStreak: while one event fails transiently
// with no success anywhere, another keeps waiting for a claim. Its busy
// answers are no success: the failing event still pauses after
// OutageAfter. And the busy event itself is neither paused nor
// dead-lettered.
func TestBusyNeitherEndsNorExtendsAStreak(t *testing.T) {
	clock := newFakeClock()
	failing, failingID := validRecord(t)
	busy, busyID := validRecord(t)
	var release atomic.Bool
	var env *testEnv
	biller := &fakeBiller{process: func(_ context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
		if release.Load() {
			return billing.Result{Outcome: billing.Charged}, nil
		}
		if ev.EventID == busyID {
			return billing.Result{}, errBusy
		}
		// Let the busy event be answered at least once between two
		// failures, or it could not have ended the streak.
		before := callsOf(env.biller, busyID)
		for deadline := time.Now().Add(10 * time.Second); callsOf(env.biller, busyID) == before; {
			if time.Now().After(deadline) {
				t.Error("the busy event was not retried")
				break
			}
			time.Sleep(time.Millisecond)
		}
		clock.Add(20 * time.Second)
		return billing.Result{}, errTransient
	}}
	env = newEnv(t, biller, nil, budgetPolicy(clock, time.Minute, 10))
	errs := make(chan error, 2)
	go func() { errs <- env.h.Handle(context.Background(), busy) }()
	go func() { errs <- env.h.Handle(context.Background(), failing) }()
	poll.Until(t, 10*time.Second, "the failing event to pause", env.h.Stalled)
	poll.Until(t, 10*time.Second, "20 attempts of the failing event", func() bool { return callsOf(biller, failingID) >= 20 })
	if calls := env.dlq.calls(); len(calls) != 0 {
		t.Fatalf("dead-lettered: %+v", calls)
	}
	release.Store(true)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := env.counters(t)[eventsKey("charged")]; got != 2 {
		t.Errorf("charged %v, want 2", got)
	}
}
