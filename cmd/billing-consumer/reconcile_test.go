package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/pgtest"
)

// reconcile --dry-run needs no provider, says to migrate a database behind
// the binary's schema (it printed "0 claims handled" and then "relation
// charge does not exist"), and counts what it would do, not "1 claims
// handled" when it handled none.
func TestReconcileDryRun(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setEnv(t, map[string]string{"BILLING_DATABASE_URL": url})
	reconcile := func() (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var stdout, stderr bytes.Buffer
		err := run(ctx, []string{"reconcile", "--dry-run"}, &stdout, &stderr)
		return stdout.String(), err
	}
	out, err := reconcile()
	if err == nil || !strings.Contains(err.Error(), "run billing-consumer migrate") || out != "" {
		t.Fatalf("unmigrated database: %v, stdout %q; want the hint to migrate and no output", err, out)
	}
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Open(t, url)
	if _, err := pool.Exec(t.Context(), `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claimed_at)
VALUES (42, '0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1d', 7, 9.99, 'pending', now() - interval '5 minutes')`); err != nil {
		t.Fatal(err)
	}
	out, err = reconcile()
	if err != nil {
		t.Fatalf("dry run without BILLING_PAYMENT_URL: %v", err)
	}
	for _, want := range []string{"dry run, nothing sent or changed; stale pending claims: 1 would re-send; now 1 pending", "42"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "handled") {
		t.Errorf("a dry run claims to have handled something:\n%s", out)
	}
	var status string
	var attempts int
	if err := pool.QueryRow(t.Context(), `SELECT status, settle_attempts FROM charge WHERE order_id = 42`).Scan(&status, &attempts); err != nil ||
		status != "pending" || attempts != 0 {
		t.Errorf("after a dry run: %s, %d attempts (%v); want it untouched", status, attempts, err)
	}
}
