package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
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

// reconcile is a sender too (SPEC §11 I4): while billing is paused it
// re-sends nothing, leaves the claim as it was, and says to resume first
// (a failed command, naming billing-consumer resume); after the resume it
// settles the claim with one request.
func TestReconcileWhilePaused(t *testing.T) {
	url := pgtest.NewDatabase(t)
	sim := paysim.New(paysim.Config{Token: "secret-token", Seed: 1})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	setEnv(t, map[string]string{"BILLING_DATABASE_URL": url, "BILLING_PAYMENT_URL": srv.URL, "BILLING_PAYMENT_TOKEN": "secret-token"})
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Open(t, url)
	if _, err := pool.Exec(t.Context(), `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claimed_at)
VALUES (43, '0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1e', 7, 9.99, 'pending', now() - interval '5 minutes')`); err != nil {
		t.Fatal(err)
	}
	command := func(args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var stdout, stderr bytes.Buffer
		err := run(ctx, args, &stdout, &stderr)
		return stdout.String(), err
	}
	if _, err := command("pause", "--reason", "INC-7 provider double charges"); err != nil {
		t.Fatal(err)
	}
	out, err := command("reconcile")
	if err == nil || !strings.Contains(err.Error(), "billing-consumer resume") {
		t.Errorf("reconcile while paused: %v; want it refused, naming billing-consumer resume\n%s", err, out)
	}
	var status string
	if err := pool.QueryRow(t.Context(), `SELECT status FROM charge WHERE order_id = 43`).Scan(&status); err != nil || status != "pending" {
		t.Errorf("claim after reconcile while paused: %q, %v; want it left pending", status, err)
	}
	if n := sim.ChargesTaken() + sim.Replays(); n != 0 || len(sim.Requests()) != 0 {
		t.Fatalf("the provider got requests %v while paused; want none", sim.Requests())
	}
	if _, err := command("resume"); err != nil {
		t.Fatal(err)
	}
	if out, err := command("reconcile"); err != nil || !strings.Contains(out, "1 charged") {
		t.Fatalf("reconcile after the resume: %v; want the claim charged\n%s", err, out)
	}
	if n := sim.ChargesFor(43); n != 1 {
		t.Fatalf("order 43 charged %d times; want 1", n)
	}
}
