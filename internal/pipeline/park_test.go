package pipeline

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
)

// fakeParker is a Parker whose answer is a function; it records the events
// it was asked to park.
type fakeParker struct {
	park    func(ev events.OrderConfirmed) (bool, error)
	mu      sync.Mutex
	parked  []events.OrderConfirmed
	records []billing.Record
}

func (p *fakeParker) Park(_ context.Context, ev events.OrderConfirmed, rec billing.Record) (bool, error) {
	ok, err := p.park(ev)
	if ok && err == nil {
		p.mu.Lock()
		p.parked, p.records = append(p.parked, ev), append(p.records, rec)
		p.mu.Unlock()
	}
	return ok, err
}

// An event the provider keeps failing while it charges others is parked
// once it has failed for ParkAfter: its record is done (Handle returns
// nil, no DLQ), it is counted as parked, and it spends no more retries.
// Where it has no claim to park, or parking fails, it goes on retrying and
// is exhausted by the budget as before.
func TestParkedAfterFailingWhileOthersSucceed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		park      func(events.OrderConfirmed) (bool, error)
		wantParks int
	}{
		{"parked", func(events.OrderConfirmed) (bool, error) { return true, nil }, 1},
		{"no claim to park", func(events.OrderConfirmed) (bool, error) { return false, nil }, 0},
		{"parking fails", func(events.OrderConfirmed) (bool, error) { return false, errors.New("database gone") }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			poison, poisonID := validRecord(t)
			var env *testEnv
			biller := &fakeBiller{process: func(ctx context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
				if ev.EventID != poisonID {
					return billing.Result{Outcome: billing.Charged}, nil
				}
				other, _ := validRecord(t)
				if err := env.h.Handle(ctx, other); err != nil {
					t.Errorf("other event: %v", err)
				}
				clock.Add(10 * time.Second)
				return billing.Result{}, errTransient
			}}
			parker := &fakeParker{park: tc.park}
			env = newEnv(t, biller, nil, func(c *Config) {
				budgetPolicy(clock, 5*time.Minute, 2)(c)
				c.ParkAfter, c.Parker, c.Deferrer = 30*time.Second, parker, &fakeDeferrer{}
			})
			if err := env.h.Handle(context.Background(), poison); err != nil {
				t.Fatal(err)
			}
			got := env.counters(t)
			if len(parker.parked) != tc.wantParks || got[eventsKey("parked")] != float64(tc.wantParks) {
				t.Fatalf("parked %d events, counter %v; want %d", len(parker.parked), got[eventsKey("parked")], tc.wantParks)
			}
			calls := env.dlq.calls()
			if tc.wantParks == 1 {
				// Failures at +10s ... +40s: 30 s of failing after the first.
				if len(calls) != 0 || callsOf(biller, poisonID) != 4 {
					t.Fatalf("%d DLQ calls, %d attempts; want none and 4 (parked after 30 s of failing)", len(calls), callsOf(biller, poisonID))
				}
				// The park keeps the record as consumed, for the decision a
				// refused re-send needs after the operator's release.
				if rec := parker.records[0]; rec.Offset != poison.Offset || !bytes.Equal(rec.Value, poison.Value) || len(rec.Headers) != 1 {
					t.Fatalf("parked with record %+v; want the consumed record", rec)
				}
				return
			}
			if len(calls) != 1 || calls[0].reason != "exhausted" {
				t.Fatalf("%d DLQ calls; want the event exhausted by its budget when it cannot be parked", len(calls))
			}
		})
	}
}

// An outage — no success anywhere — parks nothing: the event pauses,
// spending neither budget nor parking time, however long it lasts.
func TestOutageParksNothing(t *testing.T) {
	clock := newFakeClock()
	msg, _ := validRecord(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	biller := &fakeBiller{process: func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
		clock.Add(10 * time.Second)
		if call == 50 { // 500 s of outage: give up waiting
			cancel()
		}
		return billing.Result{}, errTransient
	}}
	parker := &fakeParker{park: func(events.OrderConfirmed) (bool, error) { return true, nil }}
	env := newEnv(t, biller, nil, func(c *Config) {
		budgetPolicy(clock, 20*time.Second, 0)(c)
		c.ParkAfter, c.Parker, c.Deferrer = 30*time.Second, parker, &fakeDeferrer{}
	})
	if err := env.h.Handle(ctx, msg); !errors.Is(err, context.Canceled) {
		t.Fatalf("Handle = %v; want it still waiting out the outage when cancelled", err)
	}
	if len(parker.parked) != 0 {
		t.Fatalf("parked %d events during an outage; want none", len(parker.parked))
	}
}
