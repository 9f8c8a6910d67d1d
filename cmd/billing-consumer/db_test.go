package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// runCmd runs one command of the binary and returns its stderr (JSON logs).
func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	if stdout.Len() != 0 {
		t.Errorf("%s wrote to stdout: %q", args, stdout.String())
	}
	return stderr.String(), err
}

func TestMigrateTwice(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setEnv(t, map[string]string{"BILLING_DATABASE_URL": url})

	logs, err := runCmd(t, "migrate")
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	lines := logLines(t, logs)
	applied := logsWithMsg(lines, "migration applied")
	if len(applied) == 0 {
		t.Errorf("first migrate applied nothing; logs:\n%s", logs)
	}
	done := logsWithMsg(lines, "migrations up to date")
	if len(done) != 1 || done[0]["applied"] != float64(len(applied)) {
		t.Errorf("first migrate summary %v, want applied=%d", done, len(applied))
	}

	logs, err = runCmd(t, "migrate")
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	lines = logLines(t, logs)
	if n := len(logsWithMsg(lines, "migration applied")); n != 0 {
		t.Errorf("second migrate applied %d migrations, want none", n)
	}
	done = logsWithMsg(lines, "migrations up to date")
	if len(done) != 1 || done[0]["applied"] != float64(0) {
		t.Errorf("second migrate summary %v, want applied=0", done)
	}

	pool := pgtest.Open(t, url)
	for _, table := range []string{"processed_event", "charge"} {
		var ok bool
		if err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing after migrate (%v)", table, err)
		}
	}
}

// A fresh database has its processed_event partitions as soon as migrate
// has run: the first events of a consumer started right after it find
// their partition instead of falling back to the ledger alone.
func TestMigrateCreatesPartitions(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setEnv(t, map[string]string{"BILLING_DATABASE_URL": url, "BILLING_DEDUP_PARTITIONS_AHEAD": "4"})
	before := time.Now()
	logs, err := runCmd(t, "migrate")
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if len(logsWithMsg(logLines(t, logs), "dedup retention pass")) != 1 {
		t.Errorf("migrate logged no maintenance pass:\n%s", logs)
	}
	checkPartitions(t, "after migrate", url, before, 168*time.Hour, 4)
}

// partitions returns the names of processed_event's partitions, sorted.
func partitions(t *testing.T, url string) []string {
	t.Helper()
	pool := pgtest.Open(t, url)
	rows, err := pool.Query(context.Background(), `SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'processed_event'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	return names
}

// wantPartitions is the day partitions from now-retention to now+ahead days.
func wantPartitions(now time.Time, retention time.Duration, ahead int) []string {
	var names []string
	last := dedup.PartitionFor(now).Day.AddDate(0, 0, ahead)
	for d := dedup.PartitionFor(now.Add(-retention)).Day; !d.After(last); d = d.AddDate(0, 0, 1) {
		names = append(names, dedup.Partition{Day: d}.Name())
	}
	return names
}

// checkPartitions checks that url's database has the partitions of a pass
// made between before and now with retention and ahead, and returns them.
func checkPartitions(t *testing.T, when, url string, before time.Time, retention time.Duration, ahead int) []string {
	t.Helper()
	got := partitions(t, url)
	want := wantPartitions(before, retention, ahead)
	if !slices.Equal(got, want) && !slices.Equal(got, wantPartitions(time.Now(), retention, ahead)) {
		t.Errorf("partitions %s:\n got %v\nwant %v", when, got, want)
	}
	return got
}

func TestRetention(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setEnv(t, map[string]string{"BILLING_DATABASE_URL": url})

	// Before migrate there is no table to maintain: an error, one line.
	if _, err := runCmd(t, "retention"); err == nil {
		t.Error("retention succeeded before migrate")
	} else if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}

	// migrate makes a first pass with the default settings.
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if got := partitions(t, url); len(got) == 0 {
		t.Fatal("no partitions after migrate")
	}

	// A month of retention creates a month of partitions back, and the
	// configured days ahead.
	t.Setenv("BILLING_DEDUP_RETENTION", "720h")
	t.Setenv("BILLING_DEDUP_PARTITIONS_AHEAD", "4")
	before := time.Now()
	logs, err := runCmd(t, "retention")
	if err != nil {
		t.Fatalf("retention: %v", err)
	}
	if len(logsWithMsg(logLines(t, logs), "dedup retention pass")) != 1 {
		t.Errorf("no retention pass logged:\n%s", logs)
	}
	got := checkPartitions(t, "after the first pass", url, before, 720*time.Hour, 4)

	// A second pass with the same settings changes nothing.
	if _, err := runCmd(t, "retention"); err != nil {
		t.Fatalf("second retention: %v", err)
	}
	if again := partitions(t, url); !slices.Equal(again, got) {
		t.Errorf("second pass changed the partitions:\n got %v\nwant %v", again, got)
	}

	// Shortening the retention drops the partitions wholly older than it.
	t.Setenv("BILLING_DEDUP_RETENTION", "48h")
	before = time.Now()
	if _, err := runCmd(t, "retention"); err != nil {
		t.Fatalf("retention 48h: %v", err)
	}
	checkPartitions(t, "after retention 48h", url, before, 48*time.Hour, 4)
}

// With a reachable database, run gets as far as the payment client: a token
// it refuses is reported without its value.
func TestRunRejectsBadTokenWithoutRevealingIt(t *testing.T) {
	url := pgtest.NewDatabase(t)
	setEnv(t, validEnv, map[string]string{
		"BILLING_DATABASE_URL":  url,
		"BILLING_PAYMENT_TOKEN": "tok-S3cr3t with\tspaces",
		"BILLING_HTTP_ADDR":     "127.0.0.1:0",
	})
	logs, err := runCmd(t, "run")
	if err == nil {
		t.Fatal("run accepted a token that cannot be sent in a header")
	}
	if strings.Contains(err.Error(), "S3cr3t") || strings.Contains(logs, "S3cr3t") {
		t.Errorf("the token leaks: %v\n%s", err, logs)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
}
