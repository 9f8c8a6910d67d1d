package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// insertLockTimeout is how long a billing-like insert may wait for a lock
// in these tests. No insert waits for a lock at all unless something
// conflicts with its ROW EXCLUSIVE lock on processed_event, so a pass
// that stalls billing makes them fail with lock_not_available (55P03).
const insertLockTimeout = "200ms"

// markWithLockTimeout is one billing-like transaction: the processed_event
// insert, under a tiny lock_timeout.
func markWithLockTimeout(ctx context.Context, pool *pgxpool.Pool, at time.Time) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+insertLockTimeout+"'"); err != nil {
			return err
		}
		_, err := markOne(ctx, tx, events.IDAt(at), group, at)
		return err
	})
}

// maintenanceWaiting reports whether a session of this database waits for
// a lock while running partition DDL.
func maintenanceWaiting(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'
		AND query ~* '(PARTITION|DROP TABLE)'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// TestMaintenanceNeverStallsInserts: a maintenance pass that creates and
// drops partitions while a billing transaction holds its processed_event
// insert open (a charge in flight) and a stream of billing inserts runs.
// DDL that locks processed_event against writers (CREATE TABLE ...
// PARTITION OF, DROP TABLE of a partition: ACCESS EXCLUSIVE on the parent)
// queues behind the open transaction, and every insert queues behind it:
// they fail on their lock_timeout. Creating plain tables, attaching them
// (SHARE UPDATE EXCLUSIVE) and detaching concurrently must let every
// insert through at once; the pass itself may wait for the open
// transaction, and finishes once it ends.
func TestMaintenanceNeverStallsInserts(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	m := newMaintainer(pool, c)
	m.LockTimeout = time.Minute // the pass may wait; billing must not
	mustRunOnce(t, m)
	c.Add(48 * time.Hour) // 23 and 24 Nov expire, 4 and 5 Dec are due

	// A billing transaction with a charge in flight: its insert is done,
	// its commit is far away.
	held, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx) //nolint:errcheck // committed below; this is for early failures
	if _, err := markOne(ctx, held, events.IDAt(c.Now()), group, c.Now()); err != nil {
		t.Fatal(err)
	}

	type result struct {
		pass dedup.Pass
		err  error
	}
	passDone := make(chan result, 1)
	go func() {
		pass, err := m.RunOnce(ctx)
		passDone <- result{pass, err}
	}()

	// Inserts run while the pass is under way: first until the pass is
	// seen waiting for its lock (or done), then a good number more.
	var inserted atomic.Int64
	insert := func() {
		t.Helper()
		if err := markWithLockTimeout(ctx, pool, c.Now()); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				t.Fatalf("a billing insert waited more than %s for a lock during the maintenance pass (after %d inserts): %v",
					insertLockTimeout, inserted.Load(), err)
			}
			t.Fatalf("billing insert: %v", err)
		}
		inserted.Add(1)
	}
	var finished *result
	deadline := time.Now().Add(30 * time.Second)
	for finished == nil && !maintenanceWaiting(t, pool) {
		if time.Now().After(deadline) {
			t.Fatal("the pass neither finished nor waited for a lock within 30s")
		}
		insert()
		select {
		case r := <-passDone:
			finished = &r
		default:
		}
	}
	for range 20 {
		insert()
	}
	if finished != nil {
		// DETACH CONCURRENTLY waits for the transactions that may still
		// see the partition: a pass done by now overlapped no insert.
		t.Fatalf("the pass finished while a billing transaction was open: %+v, %v", finished.pass, finished.err)
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatalf("commit the held transaction: %v", err)
	}
	if finished == nil {
		select {
		case r := <-passDone:
			finished = &r
		case <-time.After(time.Minute):
			t.Fatal("the pass did not finish after the open transaction ended")
		}
	}
	if finished.err != nil {
		t.Fatalf("pass: %v", finished.err)
	}
	if got := fmt.Sprint(finished.pass.Created, finished.pass.Dropped); got != "[processed_event_p20261204 processed_event_p20261205] [processed_event_p20261123 processed_event_p20261124]" {
		t.Fatalf("pass created and dropped %s", got)
	}
	if finished.pass.Partitions != 11 {
		t.Fatalf("%d partitions after the pass, want 11", finished.pass.Partitions)
	}
	// The new partitions take rows, and the dropped ones are gone.
	if fresh, err := mark(t, pool, events.IDAt(time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)), c.Now()); err != nil || !fresh {
		t.Fatalf("mark in a created partition = %v, %v", fresh, err)
	}
	for _, name := range finished.pass.Dropped {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil || exists {
			t.Errorf("table %s still exists after it was dropped (%v)", name, err)
		}
	}
}

// interruptDetach starts DETACH ... CONCURRENTLY of name while a billing
// transaction is open, with a lock_timeout that runs out while the detach
// waits for it: the detach stays pending, as when a pass's LockTimeout
// runs out.
func interruptDetach(t *testing.T, pool *pgxpool.Pool, name string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	held, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := markOne(ctx, held, events.IDAt(at), group, at); err != nil {
		t.Fatal(err)
	}
	admin, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Release()
	if _, err := admin.Exec(ctx, "SET lock_timeout = '100ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, "ALTER TABLE processed_event DETACH PARTITION "+name+" CONCURRENTLY")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("detach while a transaction is open = %v; want a lock timeout", err)
	}
	if _, err := admin.Exec(ctx, "RESET lock_timeout"); err != nil {
		t.Fatal(err)
	}
	var pending bool
	if err := pool.QueryRow(ctx, "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = $1::regclass", name).Scan(&pending); err != nil || !pending {
		t.Fatalf("detach of %s pending = %v, %v; want true", name, pending, err)
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// detach detaches name at once, leaving its table.
func detach(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "ALTER TABLE processed_event DETACH PARTITION "+name); err != nil {
		t.Fatal(err)
	}
}

// TestMaintenanceFinishesInterruptedDetaches: a DETACH CONCURRENTLY that
// ran out of lock_timeout stays pending, and a detach whose DROP never ran
// leaves a plain table. While their days are retained, the next pass
// attaches them again; once expired, it finalizes and drops them.
func TestMaintenanceFinishesInterruptedDetaches(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	m := newMaintainer(pool, c)
	mustRunOnce(t, m)
	kept := events.IDAt(time.Date(2026, 11, 24, 6, 0, 0, 0, time.UTC))
	if _, err := mark(t, pool, kept, c.Now()); err != nil {
		t.Fatal(err)
	}

	interruptDetach(t, pool, "processed_event_p20261123", c.Now())
	detach(t, pool, "processed_event_p20261124")
	pass := mustRunOnce(t, m)
	if got := fmt.Sprint(pass.Created, pass.Dropped); got != "[processed_event_p20261123 processed_event_p20261124] []" {
		t.Fatalf("retained days: created and dropped %s; want 23 and 24 Nov attached again", got)
	}
	if pass.Partitions != 11 {
		t.Fatalf("%d partitions, want 11", pass.Partitions)
	}
	// The re-attached partition kept its rows: dedup still holds.
	if fresh, err := mark(t, pool, kept, c.Now()); err != nil || fresh {
		t.Fatalf("mark an event of a re-attached partition = %v, %v; want false, nil", fresh, err)
	}

	interruptDetach(t, pool, "processed_event_p20261123", c.Now())
	detach(t, pool, "processed_event_p20261124")
	c.Add(48 * time.Hour)
	pass = mustRunOnce(t, m)
	if got := fmt.Sprint(pass.Dropped); got != "[processed_event_p20261123 processed_event_p20261124]" {
		t.Fatalf("dropped %s; want 23 and 24 Nov", got)
	}
	if pass.Partitions != 11 {
		t.Fatalf("%d partitions, want 11", pass.Partitions)
	}
	for _, name := range pass.Dropped {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil || exists {
			t.Errorf("table %s still exists (%v)", name, err)
		}
	}
}
