package billing_test

import (
	"context"
	"sync"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// The contract suite: the per-event Service and the batched path of the
// Batcher are two implementations of one port, and the tests of the
// money promise (crash points, interleavings, the release rule) run
// against both from one table, billerKinds. The batched biller bills each
// event under test (the victim) in the middle of a batch with two fresh
// companion events for other orders, so that every multi-row statement,
// the parallel charges and the per-event settling are exercised with the
// victim among others; the companions must end charged once too
// (assertChargedOnce checks them).

// biller is the port under test.
type biller interface {
	Process(context.Context, events.OrderConfirmed) (billing.Result, error)
}

// billerKind is one implementation under the contract tests.
type billerKind struct {
	name    string
	batched bool
}

var billerKinds = []billerKind{{"service", false}, {"batch", true}}

// forEachBiller runs f as a subtest per implementation.
func forEachBiller(t *testing.T, f func(t *testing.T, k billerKind)) {
	for _, k := range billerKinds {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// biller returns an implementation of kind k over db and c, with the
// tests' clock.
func (e *env) biller(t *testing.T, k billerKind, db postgres.Conn, c billing.Charger) biller {
	t.Helper()
	return e.billerOf(t, k, newService(t, db, c))
}

// billerOf returns svc as an implementation of kind k.
func (e *env) billerOf(t *testing.T, k billerKind, svc *billing.Service) biller {
	t.Helper()
	if !k.batched {
		return svc
	}
	return &batchBiller{e: e, svc: svc}
}

// batchBiller bills each event in a batch of three (see above).
type batchBiller struct {
	e   *env
	svc *billing.Service
}

func (b *batchBiller) Process(ctx context.Context, ev events.OrderConfirmed) (billing.Result, error) {
	batch := []events.OrderConfirmed{b.e.companion(), ev, b.e.companion()}
	res, errs := billing.ProcessBatch(ctx, b.svc, batch, 1)
	return res[1], errs[1]
}

// companionKeys are the idempotency keys of every companion event, so that
// faultCharger does not count their charges as steps of the protocol.
var companionKeys sync.Map

func isCompanion(key string) bool {
	_, ok := companionKeys.Load(key)
	return ok
}

// companion returns a fresh event for an order of its own.
func (e *env) companion() events.OrderConfirmed {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.made++
	ev := event(int64(900_000+e.made), money.Amount(100+e.made))
	e.companions = append(e.companions, ev)
	companionKeys.Store(ev.EventID.String(), true)
	return ev
}

// settleCompanions redelivers every companion to a clean service, as a
// restarted replica would, and checks that each was charged once.
func (e *env) settleCompanions(t *testing.T) {
	t.Helper()
	e.mu.Lock()
	evs := e.companions
	e.companions = nil // each is settled and checked once
	e.mu.Unlock()
	for _, ev := range evs {
		res, err := settle(context.Background(), t, e.svc, ev)
		if err != nil || (res.Outcome != billing.Charged && res.Outcome != billing.Duplicate) {
			t.Fatalf("companion order %d: %+v, %v; want charged or duplicate", ev.OrderID, res, err)
		}
		if n := e.sim.ChargesFor(ev.OrderID); n != 1 {
			t.Fatalf("companion order %d charged %d times, want 1", ev.OrderID, n)
		}
	}
}
