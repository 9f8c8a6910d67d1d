package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The claim and pause commands refuse an unsafe or incomplete command line
// before they touch the database (none is reachable here), with one line
// naming what is missing; -h prints the usage on stdout and succeeds.
func TestClaimAndPauseCommandLines(t *testing.T) {
	setEnv(t, validEnv)
	for _, tc := range []struct {
		args []string
		want string // in the error; "" for success
	}{
		{[]string{"claim"}, "missing subcommand"},
		{[]string{"claim", "undo", "--order", "1"}, `unknown subcommand "undo"`},
		{[]string{"claim", "show"}, "--order must be a positive order id"},
		{[]string{"claim", "show", "--order", "x"}, "invalid value"},
		{[]string{"claim", "release", "--order", "1", "--provider-holds-no-charge"}, "--reason is required"},
		{[]string{"claim", "release", "--order", "1", "--reason", "r"}, "--provider-holds-no-charge is required"},
		{[]string{"claim", "release", "--order", "1", "--reason", "r", "--provider-holds-no-charge", "--charge-id", "c"}, "contradicts a release"},
		{[]string{"claim", "mark-charged", "--order", "1", "--reason", "r"}, "--charge-id is required"},
		{[]string{"claim", "mark-charged", "--order", "1", "--reason", "r", "--charge-id", "c", "--provider-holds-no-charge"}, "contradicts mark-charged"},
		{[]string{"claim", "show", "--order", "1", "extra"}, `unexpected argument "extra"`},
		{[]string{"pause"}, "--reason is required"},
		{[]string{"resume", "--reason", "r"}, "--reason is for pause only"},
		{[]string{"claim", "--help"}, ""},
		{[]string{"claim", "release", "-h"}, ""},
		{[]string{"pause", "--help"}, ""},
		{[]string{"resume", "-h"}, ""},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if tc.want == "" {
			if err != nil || !strings.Contains(stdout.String(), "Usage:") {
				t.Errorf("%q: %v, stdout %q; want the usage and success", tc.args, err, stdout.String())
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errUsage) {
			t.Errorf("%q: %v; want a usage error containing %q", tc.args, err, tc.want)
		}
		if stdout.Len() > 0 {
			t.Errorf("%q printed %q on stdout before failing", tc.args, stdout.String())
		}
	}
}

// On a database the migrations have not reached, the claim and pause
// commands say to run migrate, and print nothing on stdout.
func TestClaimAndPauseOnUnmigratedDatabase(t *testing.T) {
	url := pgtest.NewDatabase(t) // empty: no migration applied
	env := map[string]string{"BILLING_DATABASE_URL": url}
	for _, args := range [][]string{
		{"claim", "show", "--order", "1"},
		{"claim", "release", "--order", "1", "--reason", "r", "--provider-holds-no-charge"},
		{"pause", "--reason", "r"},
		{"resume"},
	} {
		setEnv(t, validEnv, env)
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "run billing-consumer migrate") {
			t.Errorf("%q: %v; want the hint to run migrate", args, err)
		}
		if stdout.Len() > 0 {
			t.Errorf("%q printed %q on stdout before failing", args, stdout.String())
		}
	}
}

// claim show prints every recorded send of the claim and who made it (the
// creator's first send, its retries, a redelivery, the completer), and
// claim release, refused while a request may be in flight, says from when
// it is allowed (SPEC §11 I5).
func TestClaimShowsSendsAndRefusesInFlight(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	const order = 4242
	_, err := pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token, claimed_by, in_flight_until, decide_after)
VALUES ($1, gen_random_uuid(), 42, 99.90, 'blocked', gen_random_uuid(), 'pod-a', now() + interval '20 seconds', now() + interval '5 minutes 20 seconds')`, order)
	if err == nil {
		_, err = pool.Exec(ctx, `INSERT INTO claim_send (order_id, event_id, sender, host, in_flight_until)
SELECT order_id, event_id, s, h, now() + interval '20 seconds' FROM charge, (VALUES ('creator', 'pod-a'), ('redelivery', 'pod-b'), ('completer', 'pod-c')) AS v(s, h)
WHERE order_id = $1`, order)
	}
	if err != nil {
		t.Fatal(err)
	}
	setEnv(t, validEnv, map[string]string{"BILLING_DATABASE_URL": pool.Config().ConnString()})
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"claim", "show", "--order", "4242"}, &stdout, &stderr); err != nil {
		t.Fatalf("claim show: %v\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"decisions allowed from", "sends:", "creator (first send, recorded by the claim)", "pod-a", "redelivery", "pod-b", "completer", "pod-c"} {
		if !strings.Contains(out, want) {
			t.Errorf("claim show lacks %q:\n%s", want, out)
		}
	}
	stdout.Reset()
	err = run(ctx, []string{"claim", "release", "--order", "4242", "--reason", "r", "--provider-holds-no-charge", "--operator", "alice"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "may still be in flight") || !strings.Contains(err.Error(), "allowed from") {
		t.Fatalf("claim release while in flight: %v; want refused, saying from when it is allowed", err)
	}
	t.Logf("refused: %v", err)
}

// claim show lists the events deferred behind the order (event, the
// event it waits for, when deferred, attempts, last error) and the stray
// charges recorded for it (SPEC §11 I5 and the 2xx rule): an operator
// decides a blocked claim with both in view.
func TestClaimShowsDeferredEventsAndStrayCharges(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	const order = 4343
	var owner string
	err := pool.QueryRow(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token, last_error)
VALUES ($1, gen_random_uuid(), 42, 99.90, 'blocked', gen_random_uuid(), 'outcome unknown past block-after') RETURNING event_id::text`, order).Scan(&owner)
	if err != nil {
		t.Fatal(err)
	}
	deferred := []string{"0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c11", "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c12"}
	for i, id := range deferred {
		_, err := pool.Exec(ctx, `INSERT INTO deferred_event (consumer_group, event_id, order_id, waits_for, topic, kafka_partition, kafka_offset,
record_value, attempts, last_error) VALUES ('billing-order-confirmed', $1, $2, $3, 'orders', 0, $4, '{}', $5, $6)`,
			id, order, owner, 10+i, i+2, "held behind the blocked claim "+id[len(id)-2:])
		if err != nil {
			t.Fatal(err)
		}
	}
	setEnv(t, validEnv, map[string]string{"BILLING_DATABASE_URL": pool.Config().ConnString()})
	show := func() string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := run(ctx, []string{"claim", "show", "--order", "4343"}, &stdout, &stderr); err != nil {
			t.Fatalf("claim show: %v\n%s", err, stderr.String())
		}
		return stdout.String()
	}
	out := show()
	for _, want := range []string{"deferred:", deferred[0], deferred[1], owner, "held behind the blocked claim 11", "held behind the blocked claim 12"} {
		if !strings.Contains(out, want) {
			t.Errorf("claim show lacks %q:\n%s", want, out)
		}
	}
	if t.Failed() {
		return
	}
	const stray = "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c99"
	if _, err := pool.Exec(ctx, `INSERT INTO stray_charge (order_id, event_id, provider_charge_id, sender, claim_event_id, claim_status)
VALUES ($1, $2, 'ch_stray_1', 'creator', $3, 'pending')`, order, stray, owner); err != nil {
		t.Fatal(err)
	}
	out = show()
	for _, want := range []string{"stray charges:", stray, "ch_stray_1", "creator"} {
		if !strings.Contains(out, want) {
			t.Errorf("claim show lacks %q:\n%s", want, out)
		}
	}
	t.Logf("claim show:\n%s", out)
}

// claim show prints the claim's state beside its status column: a parked
// claim is a pending row with parked_at set, and the runbooks for parked
// claims tell the two apart by the state line.
func TestClaimShowsState(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token, parked_at)
VALUES (4444, gen_random_uuid(), 42, 99.90, 'pending', gen_random_uuid(), now()), (4445, gen_random_uuid(), 42, 99.90, 'pending', gen_random_uuid(), NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	setEnv(t, validEnv, map[string]string{"BILLING_DATABASE_URL": pool.Config().ConnString()})
	for order, state := range map[string]string{"4444": "parked", "4445": "pending"} {
		var stdout, stderr bytes.Buffer
		if err := run(ctx, []string{"claim", "show", "--order", order}, &stdout, &stderr); err != nil {
			t.Fatalf("claim show: %v\n%s", err, stderr.String())
		}
		out := stdout.String()
		for _, want := range []string{`(?m)^status\s+pending$`, `(?m)^state\s+` + state + `$`} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("claim show --order %s lacks a line matching %q:\n%s", order, want, out)
			}
		}
	}
}
