package billing_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// Tests of the Batcher's own machinery: its lifecycle and its worker pool.

// Close may be called more than once, as before the worker pool: the
// second call returns once the first is done, and Process after it says
// the batcher is closed.
func TestBatcherCloseTwice(t *testing.T) {
	e := newEnv(t, "secret-token")
	b := billing.NewBatcher(e.svc, billing.BatcherConfig{MaxBatch: 4, MaxInFlight: 2, Callers: 8})
	if res, err := b.Process(context.Background(), event(14000, 100)); err != nil || res.Outcome != billing.Charged {
		t.Fatalf("before Close: %+v, %v", res, err)
	}
	b.Close()
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("second Close panicked: %v", r)
			}
		}()
		b.Close()
	}()
	if _, err := b.Process(context.Background(), event(14001, 100)); err == nil {
		t.Fatal("Process after Close succeeded; want the batcher-closed error")
	}
}

// With fewer workers than charges in flight (Callers caps the pool), the
// charges that find no idle worker run on goroutines of their own: under
// provider faults, with more callers than workers, every event's answer is
// its own charge (the provider's charge id for its key), every order is
// charged once, and no claim is left pending.
func TestBatcherWorkerPoolOverflowExactlyOnce(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{Latency: 2 * time.Millisecond, LatencyJitter: 8 * time.Millisecond,
		ErrorRate: 0.1, ResetRate: 0.1, ConflictRate: 0.05})
	// MaxBatch becomes 3 and the pool 3 workers, for up to 4 batches of 3
	// charges (2 of each on the pool): at most 3 of 8 find a worker.
	b := billing.NewBatcher(e.svc, billing.BatcherConfig{MaxBatch: 16, MaxInFlight: 4, Linger: time.Millisecond, Callers: 3})
	defer b.Close()
	const orders = 120
	evs := make([]events.OrderConfirmed, orders)
	for i := range evs {
		evs[i] = event(int64(14100+i), money.Amount(100+i))
	}
	var mu sync.Mutex
	got := map[string]string{} // event id -> charge id answered
	var wg sync.WaitGroup
	work := make(chan events.OrderConfirmed)
	for range 12 { // more callers than Callers says: batches stay capped, nothing waits on them
		wg.Go(func() {
			for ev := range work {
				for try := 0; ; try++ {
					res, err := b.Process(context.Background(), ev)
					if err == nil {
						if res.Outcome != billing.Charged {
							t.Errorf("order %d: outcome %s; want charged", ev.OrderID, res.Outcome)
						}
						mu.Lock()
						got[ev.EventID.String()] = res.ChargeID
						mu.Unlock()
						break
					}
					if (!fault.Is(err, fault.Transient) && !fault.Is(err, fault.Busy)) || try == 500 {
						t.Errorf("order %d: %v (try %d)", ev.OrderID, err, try)
						break
					}
				}
			}
		})
	}
	for _, ev := range evs {
		work <- ev
	}
	close(work)
	wg.Wait()
	byKey := map[string]string{}
	for _, c := range e.sim.Charges() {
		byKey[c.Key] = c.ChargeID
	}
	for _, ev := range evs {
		if n := e.sim.ChargesFor(ev.OrderID); n != 1 {
			t.Errorf("order %d charged %d times", ev.OrderID, n)
		}
		if n, id := e.ledger(t, ev.OrderID); n != 1 || id != byKey[ev.EventID.String()] {
			t.Errorf("order %d: %d ledger rows, charge id %q; want 1 row with %q", ev.OrderID, n, id, byKey[ev.EventID.String()])
		}
		if st := e.status(t, ev.OrderID); st != "charged" {
			t.Errorf("order %d: ledger status %q; want charged", ev.OrderID, st)
		}
		if want, answered := byKey[ev.EventID.String()], got[ev.EventID.String()]; answered != want {
			t.Errorf("order %d: answered charge id %q, the provider's for its key is %q", ev.OrderID, answered, want)
		}
	}
}
