package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// opClaim inserts a ledger row for order in status, as the service would
// have left it, and returns its event id.
func opClaim(t *testing.T, pool *pgxpool.Pool, order int64, status string) uuid.UUID {
	t.Helper()
	ev := uuid.Must(uuid.NewV7())
	_, err := pool.Exec(context.Background(), `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token, last_error, settle_attempts)
VALUES ($1, $2, 42, 99.90, $3, $4, 'outcome unknown: timeout', 3)`, order, ev, status, uuid.Must(uuid.NewV7()))
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func opStatus(t *testing.T, pool *pgxpool.Pool, order int64) (status, chargeID string) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT status, coalesce(provider_charge_id, '') FROM charge WHERE order_id = $1`, order).Scan(&status, &chargeID)
	if err != nil {
		return "absent", ""
	}
	return status, chargeID
}

func opAudits(t *testing.T, pool *pgxpool.Pool, order int64) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM claim_audit WHERE order_id = $1`, order).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every (status, request) pair: only the safe moves change the row, each
// with exactly one audit row; every refusal changes nothing and writes
// nothing.
func TestOperatorTransitions(t *testing.T) {
	pool := pgtest.NewPool(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	release := billing.OperatorRequest{Action: billing.ActionRelease, Operator: "alice", Reason: "provider has no charge", ProviderHoldsNoCharge: true}
	mark := billing.OperatorRequest{Action: billing.ActionMarkCharged, Operator: "alice", Reason: "provider shows ch_1", ChargeID: "ch_1"}
	noFlag, noID, noReason := release, mark, mark
	noFlag.ProviderHoldsNoCharge = false
	noID.ChargeID = " "
	noReason.Reason = ""
	for i, tc := range []struct {
		name       string
		status     string
		req        billing.OperatorRequest
		wantStatus string // after; "absent" when released
		wantErr    error
	}{
		{"release blocked", "blocked", release, "absent", nil},
		{"release blocked without the flag", "blocked", noFlag, "blocked", billing.ErrUnsafe},
		{"release pending", "pending", release, "pending", billing.ErrUnsafe},
		{"release charged", "charged", release, "charged", billing.ErrUnsafe},
		{"mark blocked", "blocked", mark, "charged", nil},
		{"mark pending", "pending", mark, "charged", nil},
		{"mark charged again", "charged", mark, "charged", billing.ErrUnsafe},
		{"mark without charge id", "blocked", noID, "blocked", billing.ErrUnsafe},
		{"no reason", "blocked", noReason, "blocked", billing.ErrUnsafe},
		{"no claim", "", release, "absent", billing.ErrNoClaim},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order := int64(5000 + i)
			if tc.status != "" {
				opClaim(t, pool, order, tc.status)
			}
			req := tc.req
			req.OrderID = order
			before, err := billing.ApplyOperator(context.Background(), postgres.NewStoreOn(pool), logger, req)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ApplyOperator = %v; want %v", err, tc.wantErr)
			}
			st, id := opStatus(t, pool, order)
			if st != tc.wantStatus {
				t.Fatalf("status after = %s; want %s", st, tc.wantStatus)
			}
			wantAudits := 0
			if tc.wantErr == nil {
				wantAudits = 1
				if before.Status != tc.status {
					t.Fatalf("before.Status = %q; want %q", before.Status, tc.status)
				}
			}
			if st == "charged" && tc.wantErr == nil && id != "ch_1" {
				t.Fatalf("provider_charge_id = %q; want ch_1", id)
			}
			if n := opAudits(t, pool, order); n != wantAudits {
				t.Fatalf("audit rows = %d; want %d", n, wantAudits)
			}
		})
	}
}

// The audit row holds who, where, why, and the row before and after; show
// returns it, also once a release has deleted the claim.
func TestOperatorAuditTrail(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ev := opClaim(t, pool, 7001, "blocked")
	start := time.Now().Add(-time.Minute)
	if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), logger, billing.OperatorRequest{OrderID: 7001, Action: billing.ActionRelease,
		Operator: "bob", Host: "pod-1", Reason: "INC-42: provider has no charge", ProviderHoldsNoCharge: true}); err != nil {
		t.Fatal(err)
	}
	cl, trail, err := billing.ShowClaim(ctx, postgres.NewStoreOn(pool), 7001)
	if !errors.Is(err, billing.ErrNoClaim) || cl != nil {
		t.Fatalf("ShowClaim after release = %+v, %v; want ErrNoClaim", cl, err)
	}
	if len(trail) != 1 {
		t.Fatalf("trail = %+v; want one entry", trail)
	}
	a := trail[0]
	if a.Action != billing.ActionRelease || a.Operator != "bob" || a.Host != "pod-1" || a.Reason != "INC-42: provider has no charge" ||
		a.After != "" || a.At.Before(start) {
		t.Fatalf("audit entry = %+v", a)
	}
	var before map[string]any
	if err := json.Unmarshal([]byte(a.Before), &before); err != nil {
		t.Fatal(err)
	}
	if before["status"] != "blocked" || before["event_id"] != ev.String() || before["last_error"] != "outcome unknown: timeout" {
		t.Fatalf("audit before = %v", before)
	}

	opClaim(t, pool, 7002, "pending")
	if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), logger, billing.OperatorRequest{OrderID: 7002, Action: billing.ActionMarkCharged,
		Operator: "bob", Reason: "provider shows ch_9", ChargeID: "ch_9"}); err != nil {
		t.Fatal(err)
	}
	cl, trail, err = billing.ShowClaim(ctx, postgres.NewStoreOn(pool), 7002)
	if err != nil || cl.Status != "charged" || cl.ProviderChargeID != "ch_9" || len(trail) != 1 {
		t.Fatalf("ShowClaim = %+v, %+v, %v", cl, trail, err)
	}
	var after map[string]any
	if err := json.Unmarshal([]byte(trail[0].After), &after); err != nil {
		t.Fatal(err)
	}
	if after["status"] != "charged" || after["provider_charge_id"] != "ch_9" {
		t.Fatalf("audit after = %v", after)
	}
}

// A completer that settles the claim while the operator's command runs
// wins: the command sees the settled row (it waits on the row lock) and
// refuses, so a charge the completer recorded is never released.
func TestOperatorLosesToConcurrentSettle(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	opClaim(t, pool, 7100, "pending")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The completer (this transaction) records the provider's answer.
	if _, err := tx.Exec(ctx, `UPDATE charge SET status = 'charged', provider_charge_id = 'ch_c' WHERE order_id = 7100`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), logger, billing.OperatorRequest{OrderID: 7100, Action: billing.ActionMarkCharged,
			Operator: "carol", Reason: "r", ChargeID: "ch_other"})
		done <- err
	}()
	// Wait (bounded) until the command waits on the row lock.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the operator command never waited on the claim's row lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, billing.ErrUnsafe) {
		t.Fatalf("mark-charged after a concurrent settle = %v; want a refusal", err)
	}
	if st, id := opStatus(t, pool, 7100); st != "charged" || id != "ch_c" {
		t.Fatalf("row = %s %s; want the completer's charged ch_c", st, id)
	}
	if n := opAudits(t, pool, 7100); n != 0 {
		t.Fatalf("audit rows = %d; want 0", n)
	}
}

// A blocked claim whose order has a stray charge recorded (a 2xx under
// another event's key, stray.go) is never released: the provider holds
// money for the order, and a release would let another event charge it
// again. mark-charged stays allowed; the refusal changes nothing and
// writes no audit row.
func TestOperatorRefusesToReleaseAnOrderWithAStrayCharge(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	const order = 4242
	owner := opClaim(t, pool, order, "blocked")
	_, err := pool.Exec(ctx, `INSERT INTO stray_charge (order_id, event_id, provider_charge_id, sender, claim_event_id, claim_status)
VALUES ($1, $2, 'ch_stray', 'creator', $3, 'pending')`, order, uuid.Must(uuid.NewV7()), owner)
	if err != nil {
		t.Fatal(err)
	}
	release := billing.OperatorRequest{OrderID: order, Action: billing.ActionRelease, Operator: "alice",
		Reason: "the provider shows no charge for this claim's key", ProviderHoldsNoCharge: true}
	_, err = billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), logger, release)
	if !errors.Is(err, billing.ErrUnsafe) {
		t.Fatalf("release of a claim whose order has a stray charge: err %v, want an ErrUnsafe refusal", err)
	}
	if st, _ := opStatus(t, pool, order); st != "blocked" || opAudits(t, pool, order) != 0 {
		t.Fatalf("after the refused release: status %s, %d audit rows; want blocked and none", st, opAudits(t, pool, order))
	}
	mark := billing.OperatorRequest{OrderID: order, Action: billing.ActionMarkCharged, Operator: "alice",
		Reason: "the provider shows ch_stray", ChargeID: "ch_stray"}
	if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), logger, mark); err != nil {
		t.Fatalf("mark-charged of the same claim: %v", err)
	}
	if st, id := opStatus(t, pool, order); st != "charged" || id != "ch_stray" {
		t.Fatalf("after mark-charged: %s %q, want charged ch_stray", st, id)
	}
}
