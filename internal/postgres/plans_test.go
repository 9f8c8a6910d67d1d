package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// The completer's poll of parked claims (ParkedDue) reads
// charge_parked_due, not charge_unsettled, on a ledger whose statistics
// count no unsettled claim while charge_unsettled holds an entry for
// every claim settled since the last VACUUM: the state of a healthy
// ledger (parkedDuePlan). The index scans are counted by Postgres's
// statistics, which a backend reports once idle.
func TestParkedDueReadsTheParkedIndex(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, q := range []string{
		`INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status, claim_token)
		 SELECT i, gen_random_uuid(), 7, 1, now(), now(), 'pending', gen_random_uuid() FROM generate_series(1, 5000) i`,
		`UPDATE charge SET status = 'charged', provider_charge_id = 'ch_' || order_id`,
		`ANALYZE charge`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	scans := func() (parked, unsettled int64) {
		if err := pool.QueryRow(ctx, `SELECT
			(SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'charge_parked_due'),
			(SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'charge_unsettled')`).Scan(&parked, &unsettled); err != nil {
			t.Fatalf("index statistics: %v", err)
		}
		return parked, unsettled
	}
	parked0, unsettled0 := scans()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	const polls = 8 // past the 5 custom plans, into the cached generic one
	for range polls {
		if claims, err := (pgSession{conn: conn}).ParkedDue(ctx, 100); err != nil || len(claims) != 0 {
			t.Fatalf("ParkedDue: %d claims, %v; want none", len(claims), err)
		}
	}
	// Reported when the backend next goes idle, without the usual delay.
	if _, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatalf("flush the statistics: %v", err)
	}
	conn.Release()
	poll.Until(t, 20*time.Second, "the polls' index scans reported", func() bool {
		parked, unsettled := scans()
		return parked-parked0 >= polls || unsettled-unsettled0 >= polls
	})
	if parked, unsettled := scans(); parked-parked0 < polls || unsettled != unsettled0 {
		t.Fatalf("%d polls scanned charge_parked_due %d times and charge_unsettled %d times; want %d and 0",
			polls, parked-parked0, unsettled-unsettled0, polls)
	}
}
