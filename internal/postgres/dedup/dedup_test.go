package dedup_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/events"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

const group = "billing-order-confirmed"

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

func newMaintainer(pool *pgxpool.Pool, c *clock) *dedup.Maintainer {
	return &dedup.Maintainer{
		Pool: pool, Retention: 7 * 24 * time.Hour, Ahead: 3, LockTimeout: 2 * time.Second,
		Now: c.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func mark(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, at time.Time) (bool, error) {
	t.Helper()
	var fresh bool
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		fresh, err = markOne(context.Background(), tx, id, group, at)
		return err
	})
	return fresh, err
}

func mustRunOnce(t *testing.T, m *dedup.Maintainer) dedup.Pass {
	t.Helper()
	pass, err := m.RunOnce(context.Background())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	return pass
}

func TestMarkProcessedOnceAndAgainADayLater(t *testing.T) {
	pool := pgtest.NewPool(t)
	c := &clock{t: time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)}
	m := newMaintainer(pool, c)
	mustRunOnce(t, m)

	id := events.IDAt(c.Now())
	if fresh, err := mark(t, pool, id, c.Now()); err != nil || !fresh {
		t.Fatalf("first mark = %v, %v; want true, nil", fresh, err)
	}
	if fresh, err := mark(t, pool, id, c.Now()); err != nil || fresh {
		t.Fatalf("second mark = %v, %v; want false, nil", fresh, err)
	}
	// A redelivery a day later, after maintenance created new partitions:
	// with processed_at in the key (partitioning by processed_at) this
	// would insert a second row. Keyed on event_id alone it must conflict.
	c.Add(25 * time.Hour)
	mustRunOnce(t, m)
	if fresh, err := mark(t, pool, id, c.Now()); err != nil || fresh {
		t.Fatalf("mark a day later = %v, %v; want false, nil", fresh, err)
	}
	// Another consumer group processes the same event independently.
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		fresh, err := markOne(context.Background(), tx, id, "other-group", c.Now())
		if err == nil && !fresh {
			t.Error("another group's first mark was not fresh")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM processed_event WHERE event_id=$1", id).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows for event = %d, %v; want 2 (one per group)", n, err)
	}
}

func TestMarkProcessedRollsBackWithTheTransaction(t *testing.T) {
	pool := pgtest.NewPool(t)
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	mustRunOnce(t, newMaintainer(pool, c))
	id := events.IDAt(c.Now())
	errBusiness := errors.New("charge failed")
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := markOne(context.Background(), tx, id, group, c.Now()); err != nil {
			return err
		}
		return errBusiness
	})
	if !errors.Is(err, errBusiness) {
		t.Fatalf("BeginFunc = %v", err)
	}
	if fresh, err := mark(t, pool, id, c.Now()); err != nil || !fresh {
		t.Fatalf("mark after rollback = %v, %v; want true, nil", fresh, err)
	}
}

func TestConcurrentMarksOneWins(t *testing.T) {
	pool := pgtest.NewPool(t)
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	mustRunOnce(t, newMaintainer(pool, c))
	id := events.IDAt(c.Now())
	const n = 8
	results := make(chan bool, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			fresh, err := mark(t, pool, id, c.Now())
			if err != nil {
				t.Error(err)
			}
			results <- fresh
		})
	}
	wg.Wait()
	close(results)
	won := 0
	for fresh := range results {
		if fresh {
			won++
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d concurrent marks were fresh; want exactly 1", won, n)
	}
}

func TestMaintenanceCreatesAheadAndDropsExpired(t *testing.T) {
	pool := pgtest.NewPool(t)
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	m := newMaintainer(pool, c)
	pass := mustRunOnce(t, m)
	// 7 days back (23 Nov, whose end is after the horizon 23 Nov 12:00),
	// today, and 3 ahead: 23 Nov .. 3 Dec.
	if len(pass.Created) != 11 || pass.Partitions != 11 || len(pass.Dropped) != 0 {
		t.Fatalf("first pass = %+v; want 11 created (23 Nov..3 Dec)", pass)
	}
	if pass.Created[0] != "processed_event_p20261123" || pass.Created[10] != "processed_event_p20261203" {
		t.Fatalf("created %v", pass.Created)
	}
	if again := mustRunOnce(t, m); len(again.Created)+len(again.Dropped) != 0 || again.Partitions != 11 {
		t.Fatalf("second pass = %+v; want no change", again)
	}

	// Events land in the partition of their UUIDv7 day, boundaries included.
	for _, at := range []time.Time{
		time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 30, 23, 59, 59, 999e6, time.UTC),
		time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
	} {
		id := events.IDAt(at)
		if _, err := mark(t, pool, id, c.Now()); err != nil {
			t.Fatalf("mark %v: %v", at, err)
		}
		var table string
		if err := pool.QueryRow(context.Background(), "SELECT tableoid::regclass::text FROM processed_event WHERE event_id=$1", id).Scan(&table); err != nil {
			t.Fatal(err)
		}
		if want := dedup.PartitionFor(at).Name(); table != want {
			t.Errorf("event at %v is in %s, want %s", at, table, want)
		}
	}

	old := events.IDAt(time.Date(2026, 11, 24, 6, 0, 0, 0, time.UTC))
	if _, err := mark(t, pool, old, c.Now()); err != nil {
		t.Fatalf("mark old event: %v", err)
	}
	// Two days later the 23rd and 24th have expired: dropped, the 4th and
	// 5th of December created.
	c.Add(48 * time.Hour)
	pass = mustRunOnce(t, m)
	if len(pass.Dropped) != 2 || pass.Dropped[0] != "processed_event_p20261123" || pass.Dropped[1] != "processed_event_p20261124" {
		t.Fatalf("dropped %v; want 23 and 24 Nov", pass.Dropped)
	}
	if len(pass.Created) != 2 || pass.Partitions != 11 {
		t.Fatalf("pass = %+v; want 2 created, 11 partitions", pass)
	}
	// The expired event's partition is gone: marking it again reports
	// ErrNoPartition instead of silently treating it as new.
	if _, err := mark(t, pool, old, c.Now()); !errors.Is(err, dedup.ErrNoPartition) {
		t.Fatalf("mark expired event: %v; want ErrNoPartition", err)
	}
	// So does an event beyond the partitions created ahead.
	if _, err := mark(t, pool, events.IDAt(c.Now().Add(10*24*time.Hour)), c.Now()); !errors.Is(err, dedup.ErrNoPartition) {
		t.Fatalf("mark far-future event: %v; want ErrNoPartition", err)
	}
}

func TestMaintenanceOneReplicaAtATime(t *testing.T) {
	pool := pgtest.NewPool(t)
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	// Hold the maintenance lock from another session.
	holder, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(context.Background(), "SELECT pg_advisory_lock($1)", int64(0x6465647570)); err != nil {
		t.Fatal(err)
	}
	pass := mustRunOnce(t, newMaintainer(pool, c))
	if !pass.Skipped || len(pass.Created) != 0 {
		t.Fatalf("pass while locked = %+v; want skipped", pass)
	}
	if _, err := holder.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", int64(0x6465647570)); err != nil {
		t.Fatal(err)
	}
	if pass := mustRunOnce(t, newMaintainer(pool, c)); pass.Skipped || len(pass.Created) == 0 {
		t.Fatalf("pass after unlock = %+v", pass)
	}
}

func TestPartitionBoundsMatchUUIDv7(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 30, 13, 14, 15, 0, time.UTC),
		time.Date(2026, 11, 30, 23, 59, 59, 999e6, time.UTC),
	} {
		p := dedup.PartitionFor(at)
		id := events.IDAt(at)
		lo, hi := p.Lower(), p.Upper()
		if string(id[:]) < string(lo[:]) || string(id[:]) >= string(hi[:]) {
			t.Errorf("v7 at %v = %s not in [%s, %s)", at, id, lo, hi)
		}
	}
	if got := dedup.PartitionFor(time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)).Lower().String(); got != "01a229c0-5400-0000-0000-000000000000" {
		t.Errorf("lower bound of 30 Nov = %s", got)
	}
}

// markOne marks one event processed and reports whether its row is new.
func markOne(ctx context.Context, tx dedup.Querier, id uuid.UUID, group string, at time.Time) (bool, error) {
	fresh, err := dedup.MarkProcessed(ctx, tx, []uuid.UUID{id}, group, at)
	return len(fresh) == 1, err
}

// The retention pass deletes the dead-letter decisions (dead_letter,
// migration 00012) recorded longer than Retention ago, by the database's
// clock, and keeps the younger ones.
func TestMaintenanceDeletesExpiredDeadLetterDecisions(t *testing.T) {
	pool := pgtest.NewPool(t)
	m := newMaintainer(pool, &clock{t: time.Now()})
	oldID, youngID := uuid.New(), uuid.New()
	for _, row := range []struct {
		id  uuid.UUID
		age time.Duration
	}{{oldID, m.Retention + time.Hour}, {youngID, m.Retention - time.Hour}} {
		if _, err := pool.Exec(context.Background(), `INSERT INTO dead_letter (event_id, consumer_group, order_id, customer_id, amount, reason, replay_count, error, decided_at)
VALUES ($1, $2, 1, 1, 10.00, 'permanent', 0, 'refused', now() - $3 * interval '1 millisecond')`, row.id, group, row.age.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	if pass := mustRunOnce(t, m); pass.DecisionsDeleted != 1 {
		t.Errorf("pass deleted %d decisions; want 1, the expired one", pass.DecisionsDeleted)
	}
	var left []uuid.UUID
	rows, err := pool.Query(context.Background(), "SELECT event_id FROM dead_letter")
	if err == nil {
		left, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	}
	if err != nil || len(left) != 1 || left[0] != youngID {
		t.Errorf("decisions left %v, %v; want only the young one %s", left, err, youngID)
	}
}
