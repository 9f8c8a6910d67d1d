package billing_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// processAll sends evs through one Batcher at once (one goroutine each)
// whose single batch slot is held until all are queued, so they form
// batches; it returns results in order, after retrying every event that
// was Busy (waiting for another event of its order, as the pipeline
// does), and the sizes of the batches.
func processAll(t *testing.T, e *env, maxBatch int, evs []events.OrderConfirmed) ([]billing.Result, []error, []int) {
	t.Helper()
	var mu sync.Mutex
	var sizes []int
	b := billing.NewBatcher(e.svc, billing.BatcherConfig{MaxBatch: maxBatch, MaxInFlight: 1,
		Observe: func(n int) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() }})
	defer b.Close()
	// Occupy the only slot with a slow first event so the rest queue up.
	e.sim.SetFaults(paysim.Faults{Latency: 300 * time.Millisecond, Decline: e.decline})
	res := make([]billing.Result, len(evs))
	errs := make([]error, len(evs))
	var wg sync.WaitGroup
	for i, ev := range evs {
		wg.Go(func() { res[i], errs[i] = b.Process(context.Background(), ev) })
		if i == 0 {
			// The first one holds the slot once its charge is at the
			// provider.
			poll.Until(t, 30*time.Second, "the first event's charge at the provider", func() bool { return e.sim.InFlight() > 0 })
		}
	}
	wg.Wait()
	for i, ev := range evs {
		if fault.Is(errs[i], fault.Busy) {
			res[i], errs[i] = settle(context.Background(), t, b, ev)
		}
	}
	return res, errs, sizes
}

func TestBatchOutcomes(t *testing.T) {
	e := newEnv(t, "secret-token")
	done := event(2001, 100)
	if _, err := e.svc.Process(context.Background(), done); err != nil {
		t.Fatal(err)
	}
	a := event(2002, 500)
	sameOrder := event(2002, 500)  // another event, same amount: duplicate_order
	otherAmount := event(2003, 10) // charged first ...
	conflict := event(2003, 20)    // ... then a conflict
	evs := []events.OrderConfirmed{event(2000, 1), a, a, sameOrder, done, otherAmount, conflict, event(2004, 700)}
	res, errs, sizes := processAll(t, e, 32, evs)
	t.Logf("batch sizes %v", sizes)
	if len(sizes) < 2 || sizes[0] != 1 || sizes[1] != len(evs)-1 {
		t.Fatalf("batch sizes %v; want the first event alone, then one batch of the rest (then the retries of the busy ones)", sizes)
	}
	// The callers queue concurrently, so which of two events for one
	// order came first is not fixed: count outcomes per order instead.
	got := map[int64][]string{}
	for i, ev := range evs {
		o := string(res[i].Outcome)
		if errs[i] != nil {
			o = fault.KindOf(errs[i]).String()
		}
		got[ev.OrderID] = append(got[ev.OrderID], o)
	}
	want := map[int64][]string{
		2000: {"charged"}, 2001: {"duplicate"}, 2004: {"charged"},
		2002: {"charged", "duplicate", "duplicate_order"}, // a, a again, another event
		2003: {"charged", "conflict"},
	}
	// When the other event wins order 2002, both copies of a are
	// duplicate_order.
	if slices.Sort(got[2002]); slices.Equal(got[2002], []string{"charged", "duplicate_order", "duplicate_order"}) {
		want[2002] = got[2002]
	}
	for order, w := range want {
		slices.Sort(got[order])
		if !slices.Equal(got[order], w) {
			t.Errorf("order %d: outcomes %v, want %v", order, got[order], w)
		}
	}
	for _, order := range []int64{2000, 2001, 2002, 2003, 2004} {
		if n := e.sim.ChargesFor(order); n != 1 {
			t.Errorf("order %d charged %d times", order, n)
		}
		if n, id := e.ledger(t, order); n != 1 || id == "" {
			t.Errorf("order %d: %d ledger rows, charge id %q", order, n, id)
		}
	}
	// The conflict left no processed_event row: once fixed, it can be
	// replayed.
	loser := conflict
	if fault.Is(errs[5], fault.Conflict) {
		loser = otherAmount
	}
	if n := e.processedRows(t, loser.EventID); n != 0 {
		t.Errorf("the conflicting event kept %d processed_event rows", n)
	}
}

// One charge in the batch is declined: that event fails alone and leaves
// nothing behind; the others are charged once and recorded.
func TestBatchFailedChargeFailsItsEventAlone(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.declined[3003] = true
	evs := []events.OrderConfirmed{event(3000, 1), event(3001, 2), event(3002, 3), event(3003, 4), event(3004, 5)}
	res, errs, sizes := processAll(t, e, 32, evs)
	for i, ev := range evs {
		if ev.OrderID == 3003 {
			if !fault.Is(errs[i], fault.Permanent) {
				t.Errorf("declined order: %+v, %v; want permanent", res[i], errs[i])
			}
			if n, _ := e.ledger(t, 3003); n != 0 || e.processedRows(t, ev.EventID) != 0 {
				t.Error("the declined order left rows")
			}
			continue
		}
		if errs[i] != nil || res[i].Outcome != billing.Charged {
			t.Errorf("order %d: %+v, %v; want charged", ev.OrderID, res[i], errs[i])
		}
		if n := e.sim.ChargesFor(ev.OrderID); n != 1 {
			t.Errorf("order %d charged %d times", ev.OrderID, n)
		}
	}
	if len(sizes) < 2 || sizes[1] != len(evs)-1 {
		t.Errorf("batch sizes %v; the declined order was not billed in a batch, the test proves nothing", sizes)
	}
}

// An event outside the dedup partitions makes the batch fall back; the
// ledger decides it alone.
func TestBatchWithEventOutsidePartitions(t *testing.T) {
	e := newEnv(t, "secret-token")
	old := event(4001, 9)
	old.EventID = events.IDAt(now.Add(-40 * 24 * time.Hour))
	evs := []events.OrderConfirmed{event(4000, 1), old, event(4002, 3)}
	res, errs, sizes := processAll(t, e, 32, evs)
	if !slices.Equal(sizes, []int{1, 2}) {
		t.Fatalf("batch sizes %v; want the first event alone, then a batch of the other two: no batch fell back", sizes)
	}
	for i := range evs {
		if errs[i] != nil || res[i].Outcome != billing.Charged {
			t.Errorf("event %d: %+v, %v", i, res[i], errs[i])
		}
	}
	if !res[1].DedupBypassed {
		t.Error("the old event was not marked as decided by the ledger")
	}
}

// Many concurrent callers with duplicates and concurrent events for the
// same orders: every order is charged exactly once.
func TestBatcherConcurrentExactlyOnce(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{Latency: 5 * time.Millisecond, ErrorRate: 0.05, ResetRate: 0.05})
	b := billing.NewBatcher(e.svc, billing.BatcherConfig{MaxBatch: 16, MaxInFlight: 4, Linger: 2 * time.Millisecond})
	defer b.Close()
	var evs []events.OrderConfirmed
	for i := range 150 {
		ev := event(int64(5000+i%100), 100) // orders 5000..5049 get two distinct events
		evs = append(evs, ev)
		if i%7 == 0 {
			evs = append(evs, ev) // and some events come twice
		}
	}
	var wg sync.WaitGroup
	for _, ev := range evs {
		wg.Go(func() {
			for {
				_, err := b.Process(context.Background(), ev)
				if err == nil {
					return
				}
				if !fault.Is(err, fault.Transient) && !fault.Is(err, fault.Busy) {
					t.Errorf("order %d: %v", ev.OrderID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for order := int64(5000); order < 5100; order++ {
		if n := e.sim.ChargesFor(order); n != 1 {
			t.Errorf("order %d charged %d times", order, n)
		}
		if n, _ := e.ledger(t, order); n != 1 {
			t.Errorf("order %d has %d ledger rows", order, n)
		}
	}
}

// A charge whose outcome is unknown (the answer lost after the provider
// took it) keeps the order claimed: another event for the same order,
// even with another record key and processed meanwhile, does not charge;
// the first event's retry settles it; only then is the other a
// duplicate_order.
func TestUnknownOutcomeKeepsTheOrderClaimed(t *testing.T) {
	e := newEnv(t, "secret-token")
	a, b := event(6000, 250), event(6000, 250)
	e.sim.SetFaults(paysim.Faults{ResetRate: 1})
	if _, err := e.svc.Process(context.Background(), a); !fault.Is(err, fault.Transient) {
		t.Fatalf("first charge with its answer lost: %v; want transient", err)
	}
	e.sim.SetFaults(paysim.Faults{})
	if _, err := e.svc.Process(context.Background(), b); !fault.Is(err, fault.Busy) {
		t.Fatalf("another event while the order's charge is unknown: %v; want busy (wait)", err)
	}
	if n := e.sim.ChargesFor(6000); n != 1 {
		t.Fatalf("provider charges %d, want 1", n)
	}
	if res, err := e.svc.Process(context.Background(), a); err != nil || res.Outcome != billing.Charged {
		t.Fatalf("retry of the first event: %+v, %v; want charged (replayed)", res, err)
	}
	if res, err := e.svc.Process(context.Background(), b); err != nil || res.Outcome != billing.DuplicateOrder {
		t.Fatalf("the other event after settling: %+v, %v; want duplicate_order", res, err)
	}
	if n := e.sim.ChargesFor(6000); n != 1 {
		t.Fatalf("provider charges %d, want 1", n)
	}
}

// While another batch is in flight, a new batch waits (up to its linger)
// for events arriving one after another, until it is full; an idle
// Batcher (nothing in flight, nothing arrived within the linger) bills at
// once.
func TestBatchLingersOnlyWhileBusy(t *testing.T) {
	const linger = time.Second
	e := newEnv(t, "secret-token")
	b, sizes := sizedBatcher(e, billing.BatcherConfig{MaxBatch: 4, MaxInFlight: 2, Linger: linger})
	defer b.Close()
	// Idle: billed at once (a linger would wait a second).
	if res, err := b.Process(context.Background(), event(4500, 1)); err != nil || res.Outcome != billing.Charged {
		t.Fatalf("idle: %+v, %v", res, err)
	}
	time.Sleep(linger + linger/5) // idle again: the last event is older than the linger
	// Busy: a slow event, billed at once, holds one slot; four more
	// trickle in and gather into one batch on the other slot.
	e.sim.SetFaults(paysim.Faults{Latency: time.Second})
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Process(context.Background(), event(4501, 1)) })
	poll.Until(t, 30*time.Second, "the slow event's charge at the provider", func() bool { return e.sim.InFlight() > 0 })
	for i := range 4 {
		wg.Go(func() {
			if res, err := b.Process(context.Background(), event(int64(4502+i), 1)); err != nil || res.Outcome != billing.Charged {
				t.Errorf("event %d: %+v, %v", i, res, err)
			}
		})
		time.Sleep(5 * time.Millisecond) // one after another, not at once
	}
	wg.Wait()
	if got := sizes(); !slices.Equal(got, []int{1, 1, 4}) {
		t.Fatalf("batch sizes %v; want 1 (idle), 1 (the slow one), 4 (gathered while busy)", got)
	}
}

// Events arriving one after another keep the service busy even when no
// batch is in flight at the moment (a connection just freed): the next
// batch waits for the next event instead of paying a transaction for one.
func TestBatchLingersWhileEventsArrive(t *testing.T) {
	e := newEnv(t, "secret-token")
	b, sizes := sizedBatcher(e, billing.BatcherConfig{MaxBatch: 2, MaxInFlight: 2, Linger: 2 * time.Second})
	defer b.Close()
	if _, err := b.Process(context.Background(), event(4600, 1)); err != nil {
		t.Fatal(err)
	}
	// Right after it, with nothing in flight: two more, 20 ms apart.
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if res, err := b.Process(context.Background(), event(int64(4601+i), 1)); err != nil || res.Outcome != billing.Charged {
				t.Errorf("event %d: %+v, %v", i, res, err)
			}
		})
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	if got := sizes(); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("batch sizes %v; want 1 (idle), 2 (the next one waited for the one after)", got)
	}
}

// With one caller (BILLING_CONCURRENCY=1) no other event can come while
// one is being billed: however recent the last event, no batch waits.
func TestSequentialBatcherNeverWaits(t *testing.T) {
	e := newEnv(t, "secret-token")
	b, sizes := sizedBatcher(e, billing.BatcherConfig{MaxBatch: 32, MaxInFlight: 1, Linger: time.Hour, Callers: 1})
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		for i := range 3 {
			if _, err := b.Process(context.Background(), event(int64(4700+i), 1)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("three sequential events not billed within 30 s: a batch is waiting for a caller that cannot come")
	}
	if got := sizes(); !slices.Equal(got, []int{1, 1, 1}) {
		t.Fatalf("batch sizes %v; want 1, 1, 1", got)
	}
}

// sizedBatcher returns a Batcher over e.svc shaped by cfg and a function
// returning the sizes of its batches so far.
func sizedBatcher(e *env, cfg billing.BatcherConfig) (*billing.Batcher, func() []int) {
	var mu sync.Mutex
	var sizes []int
	cfg.Observe = func(n int) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() }
	return billing.NewBatcher(e.svc, cfg), func() []int { mu.Lock(); defer mu.Unlock(); return slices.Clone(sizes) }
}
