package billing_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

const group = "billing-order-confirmed"

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type env struct {
	pool     *pgxpool.Pool
	sim      *paysim.Sim
	client   *payment.Client // to the simulator
	charger  billing.Charger // client.ForBilling()
	svc      *billing.Service
	declined map[int64]bool // orders the simulator declines, for Faults.Decline
	// companions are the events a batched biller billed beside the
	// events under test (see biller_test.go).
	mu         sync.Mutex
	companions []events.OrderConfirmed // not yet checked
	made       int                     // companions made so far
}

func (e *env) decline(order int64) bool { return e.declined[order] }

// newEnv returns a billing service on a fresh database with today's
// partitions, charging through a real client against the simulator.
func newEnv(t *testing.T, token string) *env {
	t.Helper()
	pool := pgtest.NewPool(t)
	m := &dedup.Maintainer{Pool: pool, Retention: 7 * 24 * time.Hour, Ahead: 3, LockTimeout: time.Second,
		Now: func() time.Time { return now }, Logger: discard()}
	if _, err := m.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	sim := paysim.New(paysim.Config{Token: "secret-token", Seed: 1})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	client, err := payment.New(payment.Config{BaseURL: srv.URL, Token: token, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	charger := client.ForBilling()
	return &env{pool: pool, sim: sim, client: client, charger: charger, svc: newService(t, pool, charger), declined: map[int64]bool{}}
}

func newService(t *testing.T, db postgres.Conn, c billing.Charger) *billing.Service {
	t.Helper()
	svc, err := billing.New(billing.Config{Store: postgres.NewStoreOn(db), Charger: c, Group: group,
		Now: func() time.Time { return now }, Logger: discard(), DBTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// settle processes ev until it is no longer Busy (another event's claim
// on its order unsettled), as the pipeline's retries do. Bounded.
func settle(ctx context.Context, t *testing.T, svc interface {
	Process(context.Context, events.OrderConfirmed) (billing.Result, error)
}, ev events.OrderConfirmed) (billing.Result, error) {
	for range 500 {
		res, err := svc.Process(ctx, ev)
		if !fault.Is(err, fault.Busy) {
			return res, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("event %s still busy after 500 attempts", ev.EventID)
	return billing.Result{}, fault.Errorf(fault.Busy, "still busy")
}

// chargerFunc is a Charger of one function, for tests that wrap or
// replace the real client.
type chargerFunc func(context.Context, billing.ChargeRequest) (billing.ChargeResult, error)

func (f chargerFunc) Charge(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
	return f(ctx, ch)
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func event(orderID int64, amount money.Amount) events.OrderConfirmed {
	return events.OrderConfirmed{EventID: events.IDAt(now), EventType: events.EventType, OccurredAt: now,
		OrderID: orderID, CustomerID: 42, TotalAmount: amount}
}

// ledger returns the order's charge row count and provider charge id.
func (e *env) ledger(t *testing.T, orderID int64) (int, string) {
	t.Helper()
	var n int
	var id *string
	err := e.pool.QueryRow(context.Background(),
		"SELECT count(*), max(provider_charge_id) FROM charge WHERE order_id=$1", orderID).Scan(&n, &id)
	if err != nil {
		t.Fatal(err)
	}
	if id == nil {
		return n, ""
	}
	return n, *id
}

// status returns the order's ledger status, or "" without a row.
func (e *env) status(t *testing.T, orderID int64) string {
	t.Helper()
	var st string
	err := e.pool.QueryRow(context.Background(), "SELECT status FROM charge WHERE order_id=$1", orderID).Scan(&st)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return st
}

// age makes every unsettled claim d older, by the only clock ages are
// read from: the database's (claimed_at moves back).
func (e *env) age(t *testing.T, d time.Duration) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), "UPDATE charge SET claimed_at = claimed_at - $1 * interval '1 millisecond' WHERE status <> 'charged'",
		d.Milliseconds()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) processedRows(t *testing.T, id uuid.UUID) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM processed_event WHERE event_id=$1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestChargeThenDuplicate(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(1001, 9990)
	res, err := e.svc.Process(context.Background(), ev)
	if err != nil || res.Outcome != billing.Charged || res.ChargeID == "" {
		t.Fatalf("first Process = %+v, %v; want charged with a charge id", res, err)
	}
	res, err = e.svc.Process(context.Background(), ev)
	if err != nil || res.Outcome != billing.Duplicate {
		t.Fatalf("second Process = %+v, %v; want duplicate", res, err)
	}
	if n := e.sim.ChargesFor(1001); n != 1 {
		t.Fatalf("provider charges = %d, want 1", n)
	}
	if n, id := e.ledger(t, 1001); n != 1 || id == "" {
		t.Fatalf("ledger rows = %d, charge id %q", n, id)
	}
	var amount string
	if err := e.pool.QueryRow(context.Background(), "SELECT amount::text FROM charge WHERE order_id=1001").Scan(&amount); err != nil || amount != "99.90" {
		t.Fatalf("ledger amount = %q, %v", amount, err)
	}
}

func TestFailedChargeRollsBackSoARetryCharges(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{ErrorRate: 1})
	ev := event(1002, 500)
	_, err := e.svc.Process(context.Background(), ev)
	if !fault.Is(err, fault.Transient) {
		t.Fatalf("Process under 5xx = %v; want a transient error", err)
	}
	if n := e.processedRows(t, ev.EventID); n != 0 {
		t.Fatalf("processed_event rows after a failed charge = %d, want 0 (rolled back)", n)
	}
	// A 5xx leaves the outcome unknown: the order stays claimed, pending.
	if st := e.status(t, 1002); st != "pending" {
		t.Fatalf("ledger status after a failed charge = %q, want pending", st)
	}
	e.sim.SetFaults(paysim.Faults{})
	res, err := e.svc.Process(context.Background(), ev)
	if err != nil || res.Outcome != billing.Charged {
		t.Fatalf("retry = %+v, %v; want charged", res, err)
	}
	if n := e.sim.ChargesFor(1002); n != 1 {
		t.Fatalf("provider charges = %d, want 1", n)
	}
}

func TestAcceptThenResetChargesOnce(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{ResetRate: 1})
	ev := event(1003, 1234)
	_, err := e.svc.Process(context.Background(), ev)
	if !fault.Is(err, fault.Transient) {
		t.Fatalf("Process with the answer lost = %v; want transient (outcome unknown)", err)
	}
	if n := e.sim.ChargesFor(1003); n != 1 {
		t.Fatalf("the provider took %d charges; the fault must take exactly one", n)
	}
	if n := e.processedRows(t, ev.EventID); n != 0 {
		t.Fatalf("processed_event rows = %d after an unknown outcome, want 0", n)
	}
	e.sim.SetFaults(paysim.Faults{})
	res, err := e.svc.Process(context.Background(), ev)
	if err != nil || res.Outcome != billing.Charged || res.ChargeID == "" {
		t.Fatalf("retry = %+v, %v; want charged with the replayed charge id", res, err)
	}
	if n := e.sim.ChargesFor(1003); n != 1 {
		t.Fatalf("provider charges after retry = %d, want 1", n)
	}
	if e.sim.Replays() != 1 {
		t.Fatalf("replays = %d, want 1: the retry must reuse the key", e.sim.Replays())
	}
}

// Two different events for one order, processed at the same time, with the
// provider slow enough that both transactions overlap: one charges.
func TestConcurrentEventsForOneOrderChargeOnce(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{Latency: 150 * time.Millisecond})
	const n = 6
	outcomes := make([]billing.Outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		ev := event(1004, 2500)
		wg.Go(func() {
			res, err := settle(context.Background(), t, e.svc, ev)
			if err != nil {
				t.Errorf("event %d: %v", i, err)
			}
			outcomes[i] = res.Outcome
		})
	}
	wg.Wait()
	count := map[billing.Outcome]int{}
	for _, o := range outcomes {
		count[o]++
	}
	if count[billing.Charged] != 1 || count[billing.DuplicateOrder] != n-1 {
		t.Fatalf("outcomes = %v; want 1 charged, %d duplicate_order", count, n-1)
	}
	if c := e.sim.ChargesFor(1004); c != 1 {
		t.Fatalf("provider charges = %d, want 1", c)
	}
	if r, _ := e.ledger(t, 1004); r != 1 {
		t.Fatalf("ledger rows = %d, want 1", r)
	}
}

func TestConcurrentEventsForOneOrderWithDifferentAmounts(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{Latency: 150 * time.Millisecond})
	a, b := event(1005, 1000), event(1005, 2000)
	errs := make([]error, 2)
	results := make([]billing.Result, 2)
	var wg sync.WaitGroup
	for i, ev := range []events.OrderConfirmed{a, b} {
		wg.Go(func() { results[i], errs[i] = settle(context.Background(), t, e.svc, ev) })
	}
	wg.Wait()
	charged, conflicts := 0, 0
	for i := range 2 {
		switch {
		case errs[i] == nil && results[i].Outcome == billing.Charged:
			charged++
		case fault.Is(errs[i], fault.Conflict):
			conflicts++
		default:
			t.Errorf("event %d: %+v, %v", i, results[i], errs[i])
		}
	}
	if charged != 1 || conflicts != 1 || e.sim.ChargesFor(1005) != 1 {
		t.Fatalf("charged %d, conflicts %d, provider charges %d; want 1, 1, 1", charged, conflicts, e.sim.ChargesFor(1005))
	}
}

func TestSameEventDeliveredConcurrently(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{Latency: 100 * time.Millisecond})
	ev := event(1006, 700)
	const n = 5
	count := make(chan billing.Outcome, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			res, err := e.svc.Process(context.Background(), ev)
			if err != nil {
				t.Error(err)
			}
			count <- res.Outcome
		})
	}
	wg.Wait()
	close(count)
	got := map[billing.Outcome]int{}
	for o := range count {
		got[o]++
	}
	if got[billing.Charged] != 1 || got[billing.Duplicate] != n-1 || e.sim.ChargesFor(1006) != 1 {
		t.Fatalf("outcomes %v, provider charges %d; want 1 charged, %d duplicates, 1 charge", got, e.sim.ChargesFor(1006), n-1)
	}
}

func TestProviderRejectionsAreClassifiedAndRecordNothing(t *testing.T) {
	e := newEnv(t, "secret-token")
	e.sim.SetFaults(paysim.Faults{Decline: func(orderID int64) bool { return orderID == 1007 }})
	ev := event(1007, 100)
	if _, err := e.svc.Process(context.Background(), ev); !fault.Is(err, fault.Permanent) {
		t.Fatalf("declined charge = %v; want permanent", err)
	}
	if n, _ := e.ledger(t, 1007); n != 0 || e.processedRows(t, ev.EventID) != 0 {
		t.Fatal("a rejected charge left rows behind")
	}

	bad := newEnv(t, "wrong-token")
	if _, err := bad.svc.Process(context.Background(), event(1008, 100)); !fault.Is(err, fault.Systemic) {
		t.Fatalf("charge with rejected credentials = %v; want systemic", err)
	}
	// Not accepted at all: the attempt that claimed the order releases it,
	// so that a later attempt with good credentials creates the claim
	// afresh, and its own refusal can release it again.
	if n, _ := bad.ledger(t, 1008); n != 0 {
		t.Fatalf("a charge refused for our credentials left %d ledger rows, want 0", n)
	}
}

// A provider that saw this key with another body answers 422: a conflict,
// never retried. (The simulator is told about the key first by a direct
// charge with a different amount.)
func TestKeyReusedWithOtherParametersIsConflict(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(1009, 100)
	srv := httptest.NewServer(e.sim)
	defer srv.Close()
	client, err := payment.New(payment.Config{BaseURL: srv.URL, Token: "secret-token", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Charge(context.Background(), payment.Charge{IdempotencyKey: ev.EventID.String(),
		OrderID: 1009, CustomerID: 42, Amount: 999}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Process(context.Background(), ev); !fault.Is(err, fault.Conflict) {
		t.Fatalf("Process = %v; want conflict", err)
	}
	// The provider holds a charge under this key: the order stays claimed,
	// blocked for an operator, rather than free for another event.
	if st := e.status(t, 1009); st != "blocked" || e.processedRows(t, ev.EventID) != 0 {
		t.Fatalf("after a 422: ledger status %q, processed rows %d; want blocked, 0", st, e.processedRows(t, ev.EventID))
	}
	// Another event for the order is held behind the blocked claim (the
	// pipeline defers it at once), decided with the operator's decision:
	// not a conflict, whose runbook never replays it (SPEC §11, I3).
	if _, err := e.svc.Process(context.Background(), event(1009, 100)); !fault.Is(err, fault.Busy) || !errors.Is(err, billing.ErrHeld) {
		t.Fatalf("another event for a blocked order = %v; want held (busy, ErrHeld)", err)
	}
}

// An event older than every partition is still charged once: the ledger's
// order_id key decides, and a redelivery is a duplicate.
func TestEventOutsidePartitionsIsDecidedByLedger(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(1010, 4200)
	ev.EventID = events.IDAt(now.Add(-30 * 24 * time.Hour))
	res, err := e.svc.Process(context.Background(), ev)
	if err != nil || res.Outcome != billing.Charged || !res.DedupBypassed {
		t.Fatalf("first = %+v, %v; want charged, dedup bypassed", res, err)
	}
	// The redelivery is decided by its claim, before any dedup insert.
	res, err = e.svc.Process(context.Background(), ev)
	if err != nil || res.Outcome != billing.Duplicate {
		t.Fatalf("redelivery = %+v, %v; want duplicate", res, err)
	}
	if e.sim.ChargesFor(1010) != 1 {
		t.Fatalf("provider charges = %d", e.sim.ChargesFor(1010))
	}
}

func TestDatabaseDownIsSystemic(t *testing.T) {
	e := newEnv(t, "secret-token")
	// A pool whose server does not answer: connecting fails.
	dead, err := pgxpool.New(context.Background(), "postgres://billing@127.0.0.1:1/billing?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	svc := newService(t, dead, chargerFunc(func(context.Context, billing.ChargeRequest) (billing.ChargeResult, error) {
		t.Error("charged without a database")
		return billing.ChargeResult{}, nil
	}))
	_, err = svc.Process(context.Background(), event(1011, 100))
	if !fault.Is(err, fault.Systemic) {
		t.Fatalf("Process with the database down = %v (kind %v); want systemic", err, fault.KindOf(err))
	}
	if e.sim.ChargesFor(1011) != 0 {
		t.Fatal("charged without a database")
	}
}
