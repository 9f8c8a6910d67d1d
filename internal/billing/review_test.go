package billing_test

import (
	"context"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/pgtest"
)

// TestReviewOldReplicaStaleLetsReleaseRaceItsLastRequest (review of issue
// 29, SPEC §11 I5, rolling upgrade beside level 8). A level-8 replica
// sends without recording anything. It was SIGKILLed (its heartbeat row
// stays, going stale) right after it sent the request of a claim that
// is now blocked; its last heartbeat is 61 s old. The claim records that
// its senders' provider bound is 5 minutes (decide_after - in_flight_until),
// so the provider may still take that request's money for minutes.
// checkInFlight stops counting the old replica at heartbeat + 60 s and
// allows the release at once (its InFlightError had said "allowed from"
// heartbeat + 60 s, never adding the provider bound); only a sentence in
// docs/operations.md tells the operator to wait the bound by hand, and
// the command itself says the opposite. A release now is then followed by
// another event charging the order while the old request may still be
// taken: a double charge (I1). The command should refuse until at least
// the old replica's last heartbeat + the stale window + the provider
// bound (a graceful stop deletes the row at once: no trace at all).
func TestReviewOldReplicaStaleLetsReleaseRaceItsLastRequest(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	const order = 29901
	opClaim(t, pool, order, "blocked")
	// The claim's own recorded sends are long over; the bound its senders
	// recorded is 5 minutes.
	if _, err := pool.Exec(ctx, `UPDATE charge SET in_flight_until = now() - interval '10 minutes', decide_after = now() - interval '5 minutes'
WHERE order_id = $1`, order); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO billing_replica (replica_id, binary_level, version, consumer_group, heartbeat_at)
VALUES ('old-1', 8, 'v-old', 'g', now() - interval '61 seconds')`); err != nil {
		t.Fatal(err)
	}
	req := billing.OperatorRequest{OrderID: order, Action: billing.ActionRelease, Operator: "alice",
		Reason: "provider shows no charge yet", ProviderHoldsNoCharge: true}
	if _, err := billing.ApplyOperator(ctx, pool, discard(), req); err == nil {
		st, _ := opStatus(t, pool, order)
		t.Fatalf("release allowed (claim now %s) 61 s after the last heartbeat of a level-8 replica that sends unrecorded, "+
			"while the provider may still take its last request for up to 5 minutes (the claim's recorded bound): "+
			"want refused until the old replica's last possible send + the provider bound", st)
	} else {
		t.Logf("refused: %v", err)
	}
}
