package billing

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The completer's record of a 2xx follows the 2xx rule too, from each
// row the order may have when the answer comes. Its settling transaction
// holds the claim (FOR KEY SHARE) from before the request, so no DELETE
// can take the claim away under it on Postgres; the record is therefore
// driven here directly, in a transaction without the hold, as a foreign
// binary's change committed before it would leave it.
func TestTheCompletersRecordOfAStrayCharge(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	store := storeOn(t, pool)
	c := &Completer{Sessions: SessionsOn(pool), Now: time.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for k, tc := range []struct {
		row        string // the order's row when the 2xx comes: "" none, else another event's status
		wantStatus string
		wantOwner  bool // the order's row is the event's own
	}{
		{"", "charged", true},
		{"pending", "blocked", false},
		{"charged", "charged", false},
		{"blocked", "blocked", false},
	} {
		order, ev, other := int64(7100+k), uuid.New(), uuid.New()
		if tc.row != "" {
			if _, err := pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token)
VALUES ($1, $2, 42, 10, $3, gen_random_uuid())`, order, [16]byte(other), tc.row); err != nil {
				t.Fatal(err)
			}
		}
		amount, _ := money.ParseAmount("10.00")
		out := Settled{Claim: Claim{OrderID: order, EventID: ev, CustomerID: 42, Amount: amount}, Result: string(ClaimCharged)}
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.writeCharged(ctx, tx, &out, "ch_stray"); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatalf("row %q: %v", tc.row, err)
		}
		var owner uuid.UUID
		var status string
		err = pool.QueryRow(ctx, `SELECT event_id, status FROM charge WHERE order_id = $1`, order).Scan(&owner, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("row %q: the order has no ledger row after the completer's 2xx; want %s", tc.row, tc.wantStatus)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if status != tc.wantStatus || (owner == ev) != tc.wantOwner {
			t.Errorf("row %q: the order's row is event %s's (own %v), %s; want own %v, %s", tc.row, owner, owner == ev, status, tc.wantOwner, tc.wantStatus)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM stray_charge WHERE order_id = $1 AND event_id = $2 AND provider_charge_id = 'ch_stray'
AND sender = 'completer'`, order, [16]byte(ev)).Scan(&n); err != nil || n != 1 {
			t.Errorf("row %q: %d stray charges recorded, %v; want 1", tc.row, n, err)
		}
	}
	// Two charges for one order (the stray beside another event's charged
	// claim) are counted for reconcile; the stray that became the order's
	// own claim is not.
	sess, err := c.Sessions.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Release()
	if u, err := c.count(ctx, sess); err != nil || u.StrayBeside != 1 {
		t.Errorf("counts %+v, %v; want one order with a stray charge beside a charged claim", u, err)
	}
}
