package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The completer's poll of parked claims reads charge_parked_due, not
// charge_unsettled, on a ledger whose statistics count no unsettled claim
// while charge_unsettled holds an entry for every claim settled since the
// last VACUUM: the state of a healthy ledger (parkedDuePlan).
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
	var plan []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, parkedDuePlan); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+parkedDueSQL, 100)
		if err == nil {
			plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		return err
	})
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	if text := strings.Join(plan, "\n"); !strings.Contains(text, "charge_parked_due") {
		t.Fatalf("the parked claims' poll does not read charge_parked_due:\n%s", text)
	}
}
