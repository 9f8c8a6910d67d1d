package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
)

// An event failing while others succeed is parked when it has failed for
// ParkAfter, not at the first retry after it: the backoff before the
// attempt that parks it is cut short, since every record behind it in its
// partition waits for that park to be committed. With a 2 s ParkAfter and
// a 1.5 s backoff base the retries would come at about 1.5 s and 4.5 s
// (±20% jitter): parked at 3.6 s at the earliest. Cut short, the park
// comes at 2 s; the bound leaves a second for a loaded machine.
func TestParkedWhenParkAfterIsReached(t *testing.T) {
	const parkAfter = 2 * time.Second
	poison, poisonID := validRecord(t)
	var mu sync.Mutex
	var firstFailure time.Time
	biller := &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
		mu.Lock()
		if firstFailure.IsZero() {
			firstFailure = time.Now()
		}
		mu.Unlock()
		return billing.Result{}, errTransient
	}}
	parker := &fakeParker{park: func(events.OrderConfirmed) (bool, error) { return true, nil }}
	env := newEnv(t, biller, nil, func(c *Config) {
		c.RetryBudget, c.MaxAttempts = time.Hour, 1000
		c.OutageAfter, c.OutageThreshold = 0, 0 // the event fails alone here: no outage detection
		c.BackoffBase, c.BackoffMax = 1500*time.Millisecond, 10*time.Second
		c.ParkAfter, c.Parker, c.Deferrer = parkAfter, parker, &fakeDeferrer{}
	})
	if err := env.h.Handle(context.Background(), poison); err != nil {
		t.Fatal(err)
	}
	took := time.Since(firstFailure)
	if len(parker.parked) != 1 {
		t.Fatalf("parked %d events; want 1", len(parker.parked))
	}
	if took < parkAfter || took > parkAfter+time.Second {
		t.Fatalf("parked %v after the first failure (%d attempts); want at %v, within a second", took.Round(time.Millisecond), callsOf(biller, poisonID), parkAfter)
	}
	t.Logf("parked %v after the first failure, at attempt %d", took.Round(time.Millisecond), callsOf(biller, poisonID))
}
