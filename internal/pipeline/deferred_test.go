package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// fakeRow is a deferred event of a fakeDeferrer, and whether a pass has
// taken it.
type fakeRow struct {
	billing.Deferred
	leased bool
}

// fakeDeferrer is a Deferrer in memory: Defer answers with a function, the
// rows it stores are handed out by TakeDeferred, and it records what was
// finished and retried.
type fakeDeferrer struct {
	store func(ev events.OrderConfirmed) (bool, error)

	mu       sync.Mutex
	rows     []fakeRow
	finished []billing.Deferred
	retried  map[int64]time.Duration // order id → delay of its last retry
}

func (f *fakeDeferrer) Defer(_ context.Context, ev events.OrderConfirmed, rec billing.Record) (bool, error) {
	ok, err := f.store(ev)
	if ok && err == nil {
		f.mu.Lock()
		f.rows = append(f.rows, fakeRow{Deferred: billing.Deferred{EventID: ev.EventID, OrderID: ev.OrderID, Record: rec}})
		f.mu.Unlock()
	}
	return ok, err
}

func (f *fakeDeferrer) TakeDeferred(context.Context, time.Duration) (billing.Deferred, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.rows {
		if !f.rows[i].leased {
			f.rows[i].leased = true
			f.rows[i].Attempts++
			return f.rows[i].Deferred, true, nil
		}
	}
	return billing.Deferred{}, false, nil
}

func (f *fakeDeferrer) FinishDeferred(_ context.Context, d billing.Deferred) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.rows {
		if f.rows[i].EventID == d.EventID {
			f.rows = append(f.rows[:i], f.rows[i+1:]...)
			break
		}
	}
	f.finished = append(f.finished, d)
	return nil
}

func (f *fakeDeferrer) RetryDeferred(_ context.Context, d billing.Deferred, after time.Duration, _ error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.retried == nil {
		f.retried = map[int64]time.Duration{}
	}
	f.retried[d.OrderID] = after
	return nil
}

// An event waiting on another event's claim is deferred once it has waited
// ParkAfter: its record is stored with its key, value and headers, Handle
// returns nil (the record is committable), it is counted "parked", and no
// DLQ record is written. Where the claim settled meanwhile (Defer answers
// false) or the store fails, it goes on waiting.
func TestDeferredAfterWaitingOnAnotherClaim(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(events.OrderConfirmed) (bool, error)
		want  int
	}{
		{"deferred", func(events.OrderConfirmed) (bool, error) { return true, nil }, 1},
		{"claim settled meanwhile", func(events.OrderConfirmed) (bool, error) { return false, nil }, 0},
		{"store fails", func(events.OrderConfirmed) (bool, error) { return false, errors.New("database gone") }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			msg, _ := validRecord(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			biller := &fakeBiller{process: func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
				if call == 20 { // 200 s of waiting
					cancel()
				}
				clock.Add(10 * time.Second)
				return billing.Result{}, errBusy
			}}
			deferrer := &fakeDeferrer{store: tc.store}
			env := newEnv(t, biller, nil, func(c *Config) {
				budgetPolicy(clock, 5*time.Minute, 2)(c)
				c.ParkAfter, c.Parker, c.Deferrer = 30*time.Second, &fakeParker{park: func(events.OrderConfirmed) (bool, error) { return true, nil }}, deferrer
			})
			err := env.h.Handle(ctx, msg)
			if tc.want == 0 {
				if !errors.Is(err, context.Canceled) || len(deferrer.rows) != 0 {
					t.Fatalf("Handle = %v, %d deferred; want it still waiting when cancelled, nothing deferred", err, len(deferrer.rows))
				}
				return
			}
			if err != nil {
				t.Fatalf("Handle = %v; want the record committable once deferred", err)
			}
			// Answers at +10 s ... +40 s: deferred after 30 s of waiting.
			if n := len(biller.calls()); n != 4 || len(deferrer.rows) != 1 {
				t.Fatalf("%d calls, %d deferred; want 4 calls (30 s of waiting), 1 deferred", n, len(deferrer.rows))
			}
			rec := deferrer.rows[0].Record
			if rec.Topic != msg.Topic || rec.Partition != msg.Partition || rec.Offset != msg.Offset || !bytes.Equal(rec.Key, msg.Key) ||
				!bytes.Equal(rec.Value, msg.Value) || len(rec.Headers) != 1 || rec.Headers[0].Key != "traceparent" {
				t.Fatalf("stored record %+v; want the consumed record", rec)
			}
			got := env.counters(t)
			if got[eventsKey("parked")] != 1 || len(env.dlq.calls()) != 0 {
				t.Fatalf("parked counter %v, %d DLQ calls; want 1 and none", got[eventsKey("parked")], len(env.dlq.calls()))
			}
		})
	}
}

// A deferred event is decided as its redelivery would be: a charge or a
// duplicate_order ends it (the row is finished, counted by result); a
// conflict or a refusal is dead-lettered from the stored record (original
// key, value and headers) before the row is finished, without counting the
// record again in billing_events_total; an unknown outcome or another
// claim in the way gives the row back with a backoff; a systemic failure
// gives it back and ends the pass.
func TestDecideDeferred(t *testing.T) {
	errPermanent := fault.New(fault.Permanent, errors.New("provider answered 402"))
	for _, tc := range []struct {
		name       string
		answer     error
		outcome    billing.Outcome
		finished   bool
		dlq        string
		passFailed bool
	}{
		{"charged", nil, billing.Charged, true, "", false},
		{"duplicate_order", nil, billing.DuplicateOrder, true, "", false},
		{"conflict", errConflict, "", true, "conflict", false},
		{"refused", errPermanent, "", true, "permanent", false},
		{"unknown", errTransient, "", false, "", false},
		{"claimed again", errBusy, "", false, "", false},
		{"held behind a blocked claim", errHeld, "", false, "", false},
		{"systemic", errSystemic, "", false, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, id := validRecord(t)
			biller := &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				return billing.Result{Outcome: tc.outcome}, tc.answer
			}}
			deferrer := &fakeDeferrer{rows: []fakeRow{{Deferred: billing.Deferred{EventID: id, OrderID: 1001, Record: recordOf(msg)}}}}
			env := newEnv(t, biller, nil, func(c *Config) {
				c.ParkAfter, c.Parker, c.Deferrer = 30*time.Second, &fakeParker{}, deferrer
			})
			err := env.h.DecideDeferred(context.Background())
			if (err != nil) != tc.passFailed {
				t.Fatalf("DecideDeferred = %v; want a failed pass: %v", err, tc.passFailed)
			}
			if got := len(deferrer.finished) == 1; got != tc.finished {
				t.Fatalf("finished %v; want %v", got, tc.finished)
			}
			if !tc.finished && deferrer.retried[1001] != time.Second {
				t.Fatalf("retried after %v; want the row given back for 1 s", deferrer.retried[1001])
			}
			calls := env.dlq.calls()
			if tc.dlq == "" && len(calls) != 0 || tc.dlq != "" && (len(calls) != 1 || string(calls[0].reason) != tc.dlq) {
				t.Fatalf("DLQ calls %+v; want reason %q", calls, tc.dlq)
			}
			if tc.dlq != "" {
				sent := calls[0].msg
				if !bytes.Equal(sent.Key, msg.Key) || !bytes.Equal(sent.Value, msg.Value) || sent.Offset != msg.Offset ||
					len(sent.Headers) != 1 || string(sent.Headers[0].Value) != string(msg.Headers[0].Value) {
					t.Fatalf("dead-lettered %+v; want the original record", sent)
				}
			}
			got := env.counters(t)
			want := map[string]float64{}
			if tc.finished {
				result := string(tc.outcome)
				if tc.dlq != "" {
					result = "dlq"
					want[dlqKey(tc.dlq)] = 1
				}
				want[fmt.Sprintf("billing_deferred_decided_total{result=%q}", result)] = 1
			}
			diffCounters(t, got, want)
		})
	}
}

// The backoff of a deferred event's retries: from a second, doubling,
// capped at ten.
func TestDeferredRetryBackoff(t *testing.T) {
	for attempt, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 60: 10 * time.Second} {
		if got := retryAfter(attempt); got != want {
			t.Errorf("retryAfter(%d) = %v; want %v", attempt, got, want)
		}
	}
}

// errHeld is billing's answer for an event held behind a blocked claim.
var errHeld = fault.New(fault.Busy, fmt.Errorf("order 1001: the claim of another event is blocked: %w", billing.ErrHeld))

// An event held behind a blocked claim (billing.ErrHeld) is deferred at
// its first answer: waiting cannot help, an operator decides the claim.
// Its record is committable at once, counted "parked", never
// dead-lettered. Where the store fails it waits and retries like any
// busy event, and where the claim was released meanwhile (Defer answers
// false) it is processed again. (Defects 2, 3 and 7 of issue 29: it was
// dead-lettered as a conflict.)
func TestHeldEventIsDeferredAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(events.OrderConfirmed) (bool, error)
		calls int // of the biller, when it is deferred; 0: never deferred
	}{
		{"deferred", func(events.OrderConfirmed) (bool, error) { return true, nil }, 1},
		{"store fails", func(events.OrderConfirmed) (bool, error) { return false, errors.New("database gone") }, 0},
		{"released meanwhile", func(events.OrderConfirmed) (bool, error) { return false, nil }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, _ := validRecord(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			biller := &fakeBiller{process: func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
				if call == 5 {
					cancel()
				}
				return billing.Result{}, errHeld
			}}
			deferrer := &fakeDeferrer{store: tc.store}
			env := newEnv(t, biller, nil, func(c *Config) {
				c.ParkAfter, c.Parker, c.Deferrer = 30*time.Second, &fakeParker{}, deferrer
			})
			err := env.h.Handle(ctx, msg)
			calls := len(biller.calls())
			if tc.calls == 0 {
				if !errors.Is(err, context.Canceled) || len(deferrer.rows) != 0 || calls != 5 {
					t.Fatalf("Handle = %v after %d calls, %d deferred; want it still retrying when cancelled, nothing deferred", err, calls, len(deferrer.rows))
				}
			} else if err != nil || calls != tc.calls || len(deferrer.rows) != 1 {
				t.Fatalf("Handle = %v after %d calls, %d deferred; want the record committable, deferred at the first answer", err, calls, len(deferrer.rows))
			}
			if n := len(env.dlq.calls()); n != 0 {
				t.Fatalf("%d DLQ calls; want none", n)
			}
			if got := env.counters(t)[eventsKey("parked")]; got != float64(len(deferrer.rows)) {
				t.Fatalf("parked counter %v; want %d", got, len(deferrer.rows))
			}
		})
	}
}
