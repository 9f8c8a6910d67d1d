package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/pgtest"
)

// TestReviewClaimShowListsTheEventsDeferredBehindTheClaim (review of
// issue 29, SPEC §11 I5: "`claim show` prints every recorded send and who
// made it, and the events deferred behind the claim"). A blocked claim of
// one event has a second event of the same order deferred behind it (its
// record committed, waiting for the operator's decision). The operator
// deciding the claim needs to see that a release will let that event be
// decided (and perhaps charged) next; claim show prints the claim, its
// audit trail and its sends, but not the deferred event.
func TestReviewClaimShowListsTheEventsDeferredBehindTheClaim(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	const order = 4343
	const waiting = "019a0000-0000-7000-8000-00000000beef"
	_, err := pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token, claimed_by, in_flight_until, decide_after)
VALUES ($1, gen_random_uuid(), 42, 99.90, 'blocked', gen_random_uuid(), 'pod-a', now() - interval '10 minutes', now() - interval '5 minutes')`, order)
	if err == nil {
		_, err = pool.Exec(ctx, `INSERT INTO deferred_event (consumer_group, event_id, order_id, waits_for, topic, kafka_partition, kafka_offset, record_value)
SELECT 'billing-order-confirmed', $2::uuid, order_id, event_id, 'order-service.order.confirmed', 3, 77, '{}'::bytea FROM charge WHERE order_id = $1`, order, waiting)
	}
	if err != nil {
		t.Fatal(err)
	}
	setEnv(t, validEnv, map[string]string{"BILLING_DATABASE_URL": pool.Config().ConnString()})
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"claim", "show", "--order", "4343"}, &stdout, &stderr); err != nil {
		t.Fatalf("claim show: %v\n%s", err, stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, waiting) {
		t.Fatalf("claim show does not list event %s, deferred behind the claim:\n%s", waiting, out)
	}
}
