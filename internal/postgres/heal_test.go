package postgres_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The gate is installed once, whoever races to install it; a suspect
// order gets a blocked claim unless its claim survived charged (a pending
// one is blocked: review finding 2); the gate lifts
// only when every range's position has reached its target.
func TestHealStoreInstallsOnceBlocksAndLifts(t *testing.T) {
	ctx := testContext(t)
	pool := pgtest.NewPool(t)
	st := postgres.HealStore{DB: pool, Group: "g", Topic: "t"}
	positions := &postgres.Positions{DB: postgres.FromPool(pool)}
	if err := positions.Advance(ctx, "g", "t", map[int]int64{0: 100, 1: 50}); err != nil {
		t.Fatal(err)
	}
	survived, pending := int64(7), int64(8)
	for order, status := range map[int64]string{survived: "charged", pending: "pending"} {
		if _, err := pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token)
VALUES ($1, $2, 42, 10, $3, gen_random_uuid())`, order, uuid.Must(uuid.NewV7()), status); err != nil {
			t.Fatal(err)
		}
	}
	suspect := func(order int64) heal.Suspect {
		a, b := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
		return heal.Suspect{OrderID: order, First: heal.Event{EventID: a, OrderID: order, CustomerID: 42, Amount: 9990},
			EventIDs: []uuid.UUID{a, b}}
	}
	// Order 9's pending claim is one of its two events: one waiter, whose
	// order after the claim is the only one there is: not blocked.
	own := uuid.Must(uuid.NewV7())
	if _, err := pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token)
VALUES (9, $1, 42, 10, 'pending', gen_random_uuid())`, own); err != nil {
		t.Fatal(err)
	}
	oneWaiter := suspect(9)
	oneWaiter.EventIDs[0], oneWaiter.First.EventID = own, own
	ranges := map[int]heal.Range{0: {Lo: 100, Hi: 340, Committed: 300, Position: 100}, 1: {Lo: 50, Hi: 60, Committed: 50, Position: 50}}
	var mu sync.Mutex
	mine, blocked := 0, 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			gate, n, ok, err := st.Install(ctx, ranges, []heal.Suspect{suspect(5), suspect(survived), suspect(pending), oneWaiter}, "r1", heal.Window{Deadline: time.Minute, ProviderBound: time.Hour})
			if err != nil || len(gate) != 2 || gate[0] != ranges[0] {
				t.Errorf("Install: %v, gate %+v", err, gate)
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				mine++
				blocked += n
			}
		})
	}
	wg.Wait()
	if mine != 1 || blocked != 2 {
		t.Fatalf("installed %d times blocking %d orders; want once, 2 (order 7's claim survived charged; 8's pending one is blocked)", mine, blocked)
	}
	var pendingStatus string
	if err := pool.QueryRow(ctx, `SELECT status FROM charge WHERE order_id = $1`, pending).Scan(&pendingStatus); err != nil || pendingStatus != "blocked" {
		t.Fatalf("order 8's surviving pending claim: %q (%v), want blocked", pendingStatus, err)
	}
	if err := pool.QueryRow(ctx, `SELECT status FROM charge WHERE order_id = 9`).Scan(&pendingStatus); err != nil || pendingStatus != "pending" {
		t.Fatalf("order 9's surviving pending claim with one waiter: %q (%v), want pending", pendingStatus, err)
	}
	var late bool
	if err := pool.QueryRow(ctx, `SELECT bool_and(in_flight_until > now() + interval '50 seconds' AND decide_after > now() + interval '60 minutes')
FROM charge WHERE status <> 'charged'`).Scan(&late); err != nil || !late {
		t.Fatalf("the unsettled claims' in-flight windows after a heal: renewed %v (%v), want every one a minute and an hour out", late, err)
	}
	var status, why string
	if err := pool.QueryRow(ctx, `SELECT status, last_error FROM charge WHERE order_id = 5`).Scan(&status, &why); err != nil || status != "blocked" {
		t.Fatalf("order 5: %q (%v), want blocked", status, err)
	}
	t.Logf("order 5 blocked: %s", why)

	if down, err := st.Lift(ctx); err != nil || down {
		t.Fatalf("Lift with positions short of the targets: %v, %v; want still up", down, err)
	}
	if err := positions.Advance(ctx, "g", "t", map[int]int64{0: 340}); err != nil {
		t.Fatal(err)
	}
	if down, err := st.Lift(ctx); err != nil || down {
		t.Fatalf("Lift with partition 1 short: %v, %v; want still up", down, err)
	}
	if err := positions.Advance(ctx, "g", "t", map[int]int64{1: 60}); err != nil {
		t.Fatal(err)
	}
	if down, err := st.Lift(ctx); err != nil || !down {
		t.Fatalf("Lift with every position at its target: %v, %v; want lifted", down, err)
	}
	if gate, err := st.Gate(ctx); err != nil || gate != nil {
		t.Fatalf("Gate after the lift: %+v, %v; want none", gate, err)
	}
	// A later heal installs afresh: the lifted rows are history.
	if _, _, ok, err := st.Install(ctx, ranges, nil, "r2", heal.Window{}); err != nil || !ok {
		t.Fatalf("a second heal: %v, %v", ok, err)
	}
}
