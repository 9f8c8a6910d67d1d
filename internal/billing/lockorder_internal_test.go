package billing

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The ledger statements lock their rows in the order of their arrays, so
// the service hands them in order of order_id (byOrder): a creator's batch
// recording orders 1 and 2 in its charge transaction (the row locks held
// to its COMMIT) and a redelivery's batch recording the send of 2 and 1
// must not deadlock. A blocker session fixes the interleaving; under load
// it is a race between batches. (Found by the adversarial review of
// 18426e2, where markSent deadlocked or made the record fail with 40P01.)
func TestLedgerStatementsLockInOrderOfOrders(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	x, y := uuid.New(), uuid.New()
	for _, r := range []struct {
		o int64
		e uuid.UUID
	}{{1, x}, {2, y}} {
		if _, err := pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status, claim_token)
VALUES ($1, $2, 42, 10, now(), now(), 'pending', gen_random_uuid())`, r.o, [16]byte(r.e)); err != nil {
			t.Fatal(err)
		}
	}
	svc := &Service{store: storeOn(t, pool), group: "g", now: time.Now, logger: slog.New(slog.NewTextHandler(io.Discard, nil)), dbTimeout: 10 * time.Second}
	blocker, err := pool.Begin(ctx) // any short lock on order 1, to fix the order
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, "SELECT 1 FROM charge WHERE order_id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	creatorTx, err := svc.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer creatorTx.Rollback(ctx)
	recordErr := make(chan error, 1)
	go func() {
		_, err := creatorTx.MarkCharged(ctx, []int64{1, 2}, []uuid.UUID{x, y}, []string{"ch_x", "ch_y"}, time.Now())
		recordErr <- err
	}()
	waitLocked(t, pool, "UPDATE charge AS c SET provider_charge_id%")
	markErr := make(chan error, 1)
	go func() {
		evs := []events.OrderConfirmed{{OrderID: 2, EventID: y}, {OrderID: 1, EventID: x}} // the batch's order
		_, err := svc.recordSends(ctx, evs, []bool{false, false}, []bool{false, false}, make([]response, 2))
		markErr <- err
	}()
	waitLocked(t, pool, "WITH sent AS (%UPDATE charge c SET others_sent_at%")
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	rerr := <-recordErr
	if err := creatorTx.Commit(ctx); err != nil && rerr == nil {
		rerr = err
	}
	merr := <-markErr
	t.Logf("record: %v; markSent: %v", rerr, merr)
	var pe *pgconn.PgError
	if errors.As(rerr, &pe) && pe.Code == "40P01" || errors.As(merr, &pe) && pe.Code == "40P01" {
		t.Errorf("the creator's record and a redelivery's markSent deadlocked (%s)", pe.Message)
	}
	if rerr != nil || merr != nil {
		t.Errorf("record: %v; markSent: %v; want both to succeed", rerr, merr)
	}
}

// waitLocked waits until a statement like pattern waits on a lock.
func waitLocked(t *testing.T, pool *pgxpool.Pool, pattern string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatalf("no statement like %q waits on a lock", pattern)
}
