package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maintenanceLockKey is the Postgres advisory lock that lets one replica at
// a time maintain partitions ("dedup" in ASCII).
const maintenanceLockKey int64 = 0x6465647570

// Maintainer creates processed_event partitions ahead of time and drops the
// expired ones. Several replicas may call it at once: an advisory lock lets
// one of them work and the others skip the pass.
type Maintainer struct {
	Pool *pgxpool.Pool
	// Retention is how long processed_event rows are kept
	// (BILLING_DEDUP_RETENTION). A partition is dropped once its whole day
	// is older than Retention; partitions are also created back to
	// now-Retention, so an old redelivered event still finds its partition.
	Retention time.Duration
	// Ahead is how many days after today get a partition; at least 2, since
	// a valid event may be up to 24 h in the future.
	Ahead int
	// LockTimeout bounds how long a CREATE or DROP waits for its lock on
	// processed_event. DDL on a partition locks the parent table, and a
	// waiting DDL statement blocks every insert queued behind it, so it is
	// better to give up and retry on the next pass.
	LockTimeout time.Duration
	Now         func() time.Time
	Logger      *slog.Logger
}

// Pass is what one maintenance pass did.
type Pass struct {
	// Skipped is true when another process held the maintenance lock.
	Skipped bool
	Created []string
	Dropped []string
	// Partitions is the number of processed_event partitions after the
	// pass (skipped passes count them too).
	Partitions int
}

// RunOnce makes one maintenance pass: create the partitions from
// now-Retention to now+Ahead days, drop those that ended more than
// Retention ago. Dropping is DROP TABLE, never DELETE: it frees the space at
// once and leaves no dead tuples behind.
func (m *Maintainer) RunOnce(ctx context.Context) (Pass, error) {
	if m.Retention <= 0 || m.Ahead < 2 {
		return Pass{}, fmt.Errorf("dedup maintenance: retention %v must be positive and ahead %d at least 2", m.Retention, m.Ahead)
	}
	conn, err := m.Pool.Acquire(ctx)
	if err != nil {
		return Pass{}, fmt.Errorf("dedup maintenance: %w", err)
	}
	defer conn.Release()

	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", maintenanceLockKey).Scan(&locked); err != nil {
		return Pass{}, fmt.Errorf("dedup maintenance lock: %w", err)
	}
	if !locked {
		n, err := countPartitions(ctx, conn)
		return Pass{Skipped: true, Partitions: n}, err
	}
	defer func() {
		// A session lock outlives the connection's return to the pool: if it
		// cannot be released, close the connection, which releases it.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", maintenanceLockKey); err != nil {
			_ = conn.Hijack().Close(uctx)
		}
	}()

	if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d", m.LockTimeout.Milliseconds())); err != nil {
		return Pass{}, fmt.Errorf("dedup maintenance: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout") //nolint:errcheck // best effort; a broken conn is discarded by the pool

	existing, err := listPartitions(ctx, conn)
	if err != nil {
		return Pass{}, err
	}
	now := m.Now()
	var pass Pass
	var errs []error
	horizon := now.Add(-m.Retention)
	for _, p := range existing {
		if p.End().After(horizon) {
			continue
		}
		if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+p.Name()); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", p.Name(), err))
			continue
		}
		pass.Dropped = append(pass.Dropped, p.Name())
	}
	for d := PartitionFor(horizon).Day; !d.After(PartitionFor(now).Day.AddDate(0, 0, m.Ahead)); d = d.AddDate(0, 0, 1) {
		p := Partition{Day: d}
		if slices.Contains(existing, p) {
			continue
		}
		if _, err := conn.Exec(ctx, p.createSQL()); err != nil {
			errs = append(errs, fmt.Errorf("create %s: %w", p.Name(), err))
			continue
		}
		pass.Created = append(pass.Created, p.Name())
	}
	pass.Partitions, err = countPartitions(ctx, conn)
	if err != nil {
		errs = append(errs, err)
	}
	m.Logger.Info("dedup retention pass", "created", pass.Created, "dropped", pass.Dropped,
		"partitions", pass.Partitions, "errors", len(errs))
	return pass, errors.Join(errs...)
}

// Run makes a pass now and then every interval until ctx ends, logging
// failures (the next pass retries). onPass, when not nil, sees every pass
// that succeeded; the consumer uses it for the billing_dedup_partitions
// gauge.
func (m *Maintainer) Run(ctx context.Context, interval time.Duration, onPass func(Pass)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pass, err := m.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			m.Logger.Error("dedup retention pass failed", "err", err)
		}
		if err == nil && onPass != nil {
			onPass(pass)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// listPartitions returns processed_event's partitions that follow the
// naming scheme, oldest first.
func listPartitions(ctx context.Context, conn *pgxpool.Conn) ([]Partition, error) {
	rows, err := conn.Query(ctx, partitionsSQL)
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	var ps []Partition
	for _, n := range names {
		if p, ok := parseName(n); ok {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b Partition) int { return a.Day.Compare(b.Day) })
	return ps, nil
}

const partitionsSQL = `SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_event'::regclass`

func countPartitions(ctx context.Context, conn *pgxpool.Conn) (int, error) {
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM ("+partitionsSQL+") p").Scan(&n); err != nil {
		return 0, fmt.Errorf("count partitions: %w", err)
	}
	return n, nil
}
