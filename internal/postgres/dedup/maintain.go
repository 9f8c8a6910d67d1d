package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/postgres/pglock"
)

// maintenanceLockKey is the Postgres advisory lock that lets one replica at
// a time maintain partitions ("dedup" in ASCII).
const maintenanceLockKey int64 = 0x6465647570

// Maintainer creates processed_event partitions ahead of time and drops the
// expired ones. Several replicas may call it at once: an advisory lock lets
// one of them work and the others skip the pass.
//
// A pass never makes a billing insert wait. Billing transactions hold ROW
// EXCLUSIVE on processed_event for as long as their charge takes, and
// CREATE TABLE ... PARTITION OF or DROP TABLE of a partition want ACCESS
// EXCLUSIVE on it: queued behind the open transactions, they would queue
// every new insert behind themselves. So a partition is created as a plain
// table and attached (SHARE UPDATE EXCLUSIVE on processed_event), and an
// expired one is detached concurrently (SHARE UPDATE EXCLUSIVE, then a wait
// for the transactions that may still see it) and dropped once it is a
// table of its own. Neither lock conflicts with ROW EXCLUSIVE (Postgres 15
// docs, ALTER TABLE and "Explicit Locking").
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
	// LockTimeout bounds each lock wait of a pass: an ATTACH or DETACH
	// waiting for another maintenance statement or a manual VACUUM, a
	// DETACH CONCURRENTLY waiting for older transactions to end. None of
	// them holds up billing, but a pass must end. A detach cut short stays
	// pending (pg_inherits.inhdetachpending) and the next pass finalizes it.
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
	// pass (skipped passes count them too); a partition whose detach is
	// pending no longer counts.
	Partitions int
	// DecisionsDeleted is how many dead-letter decisions (dead_letter,
	// billing's) older than Retention the pass deleted.
	DecisionsDeleted int64
}

// RunOnce makes one maintenance pass: create the partitions from
// now-Retention to now+Ahead days, then drop those that ended more than
// Retention ago. Dropping is DROP TABLE, never DELETE: it frees the space at
// once and leaves no dead tuples behind. Creating comes first, so a drop
// that waits long for old transactions does not delay tomorrow's partition.
func (m *Maintainer) RunOnce(ctx context.Context) (Pass, error) {
	if m.Retention <= 0 || m.Ahead < 2 {
		return Pass{}, fmt.Errorf("dedup maintenance: retention %v must be positive and ahead %d at least 2", m.Retention, m.Ahead)
	}
	conn, err := m.Pool.Acquire(ctx)
	if err != nil {
		return Pass{}, fmt.Errorf("dedup maintenance: %w", err)
	}
	defer conn.Release()

	unlock, locked, err := pglock.TryLock(ctx, conn, maintenanceLockKey, 5*time.Second)
	if err != nil {
		return Pass{}, fmt.Errorf("dedup maintenance lock: %w", err)
	}
	if !locked {
		n, err := countPartitions(ctx, conn)
		return Pass{Skipped: true, Partitions: n}, err
	}
	defer unlock()

	if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d", m.LockTimeout.Milliseconds())); err != nil {
		return Pass{}, fmt.Errorf("dedup maintenance: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "RESET lock_timeout") //nolint:errcheck // best effort; a broken conn is discarded by the pool

	tables, err := listTables(ctx, conn)
	if err != nil {
		return Pass{}, err
	}
	now := m.Now()
	var pass Pass
	var errs []error
	horizon := now.Add(-m.Retention)
	for d := PartitionFor(horizon).Day; !d.After(PartitionFor(now).Day.AddDate(0, 0, m.Ahead)); d = d.AddDate(0, 0, 1) {
		p := Partition{Day: d}
		t := tables[p]
		if t.attached && !t.detachPending {
			continue
		}
		if err := create(ctx, conn, p, t); err != nil {
			errs = append(errs, fmt.Errorf("create %s: %w", p.Name(), err))
			continue
		}
		pass.Created = append(pass.Created, p.Name())
	}
	for _, p := range sortedDays(tables) {
		if p.End().After(horizon) {
			continue
		}
		if err := drop(ctx, conn, p, tables[p]); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", p.Name(), err))
			continue
		}
		pass.Dropped = append(pass.Dropped, p.Name())
	}
	if pass.DecisionsDeleted, err = deleteDecisions(ctx, conn, m.Retention); err != nil {
		errs = append(errs, err)
	}
	pass.Partitions, err = countPartitions(ctx, conn)
	if err != nil {
		errs = append(errs, err)
	}
	m.Logger.Info("dedup retention pass", "created", pass.Created, "dropped", pass.Dropped,
		"partitions", pass.Partitions, "decisions_deleted", pass.DecisionsDeleted, "errors", len(errs))
	return pass, errors.Join(errs...)
}

// create makes p a partition: a plain table with processed_event's columns
// and a CHECK of p's bounds, so that ATTACH proves the partition constraint
// from it instead of scanning the table, then attached. One transaction:
// an interrupted pass leaves no unattached table behind. A table of p's
// name that is not attached (detached, and the retention lengthened before
// it was dropped) is attached again with its rows; one whose detach is
// pending is first finalized.
//
// The CHECK stays after the attach: dropping it would take ACCESS
// EXCLUSIVE on a partition that may already take inserts, to save a range
// comparison per row.
func create(ctx context.Context, conn *pgxpool.Conn, p Partition, t table) error {
	if t.detachPending {
		if _, err := conn.Exec(ctx, p.finalizeSQL()); err != nil {
			return err
		}
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, p.createSQL()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, p.attachSQL())
		return err
	})
}

// drop detaches p and drops its table. DETACH ... CONCURRENTLY cannot run
// in a transaction block (conn.Exec without arguments is one simple-protocol
// statement); a detach an earlier pass left pending is finished with
// FINALIZE instead, and a table already detached is only dropped.
func drop(ctx context.Context, conn *pgxpool.Conn, p Partition, t table) error {
	switch {
	case t.detachPending:
		if _, err := conn.Exec(ctx, p.finalizeSQL()); err != nil {
			return err
		}
	case t.attached:
		if _, err := conn.Exec(ctx, p.detachSQL()); err != nil {
			return err
		}
	}
	_, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+p.Name())
	return err
}

// table is a table named like a processed_event partition.
type table struct {
	// attached: a partition of processed_event, pending detach or not.
	attached bool
	// detachPending: a DETACH ... CONCURRENTLY began and did not finish.
	detachPending bool
}

// listTables returns the tables of processed_event's schema that follow
// the partition naming scheme, attached or not: a table an interrupted
// pass detached but did not drop is dropped by the next one.
func listTables(ctx context.Context, conn *pgxpool.Conn) (map[Partition]table, error) {
	rows, err := conn.Query(ctx, tablesSQL)
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	defer rows.Close()
	out := map[Partition]table{}
	for rows.Next() {
		var name string
		var t table
		if err := rows.Scan(&name, &t.attached, &t.detachPending); err != nil {
			return nil, fmt.Errorf("list partitions: %w", err)
		}
		if p, ok := parseName(name); ok {
			out[p] = t
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	return out, nil
}

// sortedDays returns the partitions of tables, oldest first: a pending
// detach is finalized before the next detach, as Postgres allows one
// pending detach per table.
func sortedDays(tables map[Partition]table) []Partition {
	ps := slices.Collect(maps.Keys(tables))
	slices.SortFunc(ps, func(a, b Partition) int { return a.Day.Compare(b.Day) })
	return ps
}

const tablesSQL = `SELECT c.relname, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false)
FROM pg_class c
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = 'processed_event'::regclass
WHERE c.relkind = 'r' AND c.relname LIKE 'processed\_event\_p%'
AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'processed_event'::regclass)`

// deleteDecisionsSQL deletes up to a batch of the dead-letter decisions
// recorded more than $1 milliseconds ago, by the database's clock. A
// bounded DELETE, not a partition DROP as for processed_event: the table
// holds one row per dead-lettered event, a few a day, and a short
// statement keeps its locks and WAL small even after a storm of dead
// letters (the next pass deletes the rest). A decision deleted only means
// that a record redelivered after the retention is decided afresh, as
// before migration 00012.
const deleteDecisionsSQL = `DELETE FROM dead_letter WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM dead_letter WHERE decided_at < now() - $1 * interval '1 millisecond' LIMIT 10000))`

func deleteDecisions(ctx context.Context, conn *pgxpool.Conn, retention time.Duration) (int64, error) {
	tag, err := conn.Exec(ctx, deleteDecisionsSQL, retention.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("delete expired dead-letter decisions: %w", err)
	}
	return tag.RowsAffected(), nil
}

func countPartitions(ctx context.Context, conn *pgxpool.Conn) (int, error) {
	var n int
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_inherits
WHERE inhparent = 'processed_event'::regclass AND NOT inhdetachpending`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count partitions: %w", err)
	}
	return n, nil
}
