package postgres

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/db/migrations"
)

// Positions is the consumer_position table on DB: how far the
// database holds the decisions of each partition (docs/design.md,
// "Positions"). It implements consumer.Positions. Safe for concurrent use.
type Positions struct {
	DB *DB
}

// advanceSQL moves each given partition's position forward, never back:
// a row whose next_offset is not below the new one is left as it is (an
// older write that lands late loses). Rows are taken in partition order,
// so two writers of overlapping partitions (the old and the new owner
// around a rebalance, an operator's accept) cannot deadlock.
const advanceSQL = `INSERT INTO consumer_position AS p (consumer_group, topic, partition, next_offset)
SELECT $1, $2, t.partition, t.next_offset
FROM unnest($3::int[], $4::bigint[]) AS t(partition, next_offset)
ORDER BY t.partition
ON CONFLICT (consumer_group, topic, partition) DO UPDATE
SET next_offset = excluded.next_offset, written_at = now()
WHERE p.next_offset < excluded.next_offset`

// Advance moves group's positions of topic forward to offsets (partition:
// next offset) in one statement, committed on return. A position never
// moves backwards; a partition without a row gets one (its first fill).
func (p *Positions) Advance(ctx context.Context, group, topic string, offsets map[int]int64) error {
	if len(offsets) == 0 {
		return nil
	}
	parts, nexts := columns(offsets)
	if _, err := p.DB.pool.Exec(ctx, advanceSQL, group, topic, parts, nexts); err != nil {
		return fmt.Errorf("advance positions of %s/%s: %w", group, topic, err)
	}
	return nil
}

// columns returns offsets as two arrays in partition order.
func columns(offsets map[int]int64) ([]int32, []int64) {
	ids := slices.Sorted(maps.Keys(offsets))
	parts := make([]int32, len(ids))
	nexts := make([]int64, len(ids))
	for i, id := range ids {
		parts[i], nexts[i] = int32(id), offsets[id]
	}
	return parts, nexts
}

// Position is one partition's row.
type Position struct {
	// Next is the offset below which the database holds every decision.
	Next int64
	// WrittenAt is when it last moved, by the database's clock.
	WrittenAt time.Time
}

// List returns group's positions of topic by partition; a partition
// without a row (not tracked yet) is absent.
func (p *Positions) List(ctx context.Context, group, topic string) (map[int]Position, error) {
	rows, err := p.DB.pool.Query(ctx, `SELECT partition, next_offset, written_at FROM consumer_position
WHERE consumer_group = $1 AND topic = $2`, group, topic)
	if err != nil {
		return nil, fmt.Errorf("read positions of %s/%s: %w", group, topic, err)
	}
	out := map[int]Position{}
	var part int32
	var pos Position
	if _, err := pgx.ForEachRow(rows, []any{&part, &pos.Next, &pos.WrittenAt}, func() error {
		out[int(part)] = pos
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read positions of %s/%s: %w", group, topic, err)
	}
	return out, nil
}

// Audit is who accepts positions, from where and why; Operator and Reason
// must not be empty.
type Audit struct{ Operator, Host, Reason string }

// Accepted is what Accept did to one partition: Before is its position
// before (-1: no row), After its position now; Moved is false when the
// position was already at or past the target and nothing was written.
type Accepted struct {
	Partition     int
	Before, After int64
	Moved         bool
}

// ErrNoAudit is returned by Accept for an empty operator or reason.
var ErrNoAudit = errors.New("accepting positions needs an operator and a reason")

// Accept moves group's positions of topic forward to targets (partition:
// the group's committed offset in Kafka), never back, and records each
// move in position_audit in the same transaction: an operator's
// acknowledgement that the offsets between were skipped on purpose (a
// forward reset), so that the healing does not take them for lost
// commits. It returns one Accepted per target, in partition order.
func (p *Positions) Accept(ctx context.Context, group, topic string, targets map[int]int64, a Audit) ([]Accepted, error) {
	if a.Operator == "" || a.Reason == "" {
		return nil, ErrNoAudit
	}
	var out []Accepted
	err := pgx.BeginFunc(ctx, p.DB.pool, func(tx pgx.Tx) error {
		out = out[:0]
		for _, id := range slices.Sorted(maps.Keys(targets)) {
			acc, err := acceptOne(ctx, tx, group, topic, id, targets[id], a)
			if err != nil {
				return err
			}
			out = append(out, acc)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("accept positions of %s/%s: %w", group, topic, err)
	}
	return out, nil
}

// acceptOne moves one partition's position to target in tx, with its
// audit row, if target is ahead of it.
func acceptOne(ctx context.Context, tx pgx.Tx, group, topic string, id int, target int64, a Audit) (Accepted, error) {
	acc := Accepted{Partition: id, Before: -1, After: -1}
	// The row lock holds off a committer's Advance until the decision is
	// made; a partition with no row is locked by the insert below.
	err := tx.QueryRow(ctx, `SELECT next_offset FROM consumer_position
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, group, topic, id).Scan(&acc.Before)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return acc, err
	}
	acc.After = acc.Before
	if target <= acc.Before {
		return acc, nil
	}
	parts, nexts := columns(map[int]int64{id: target})
	tag, err := tx.Exec(ctx, advanceSQL, group, topic, parts, nexts)
	if err != nil {
		return acc, err
	}
	if tag.RowsAffected() == 0 { // a committer got there first, past target
		return acc, nil
	}
	var before *int64
	if acc.Before >= 0 {
		before = &acc.Before
	}
	if _, err := tx.Exec(ctx, `INSERT INTO position_audit (consumer_group, topic, partition, operator, host, reason, before, after)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, group, topic, id, a.Operator, a.Host, a.Reason, before, target); err != nil {
		return acc, err
	}
	acc.After, acc.Moved = target, true
	return acc, nil
}

// PositionsFrom is the first binary schema level that writes positions
// (migration 00013): replicas below it commit offsets without them.
const PositionsFrom = 13

// Untracked returns the replicas of group registered in billing_replica
// (db/migrations' registry) with a level below PositionsFrom and a
// heartbeat fresher than migrations.ReplicaStaleAfter, as "id (level N,
// seen Ns ago)": while one runs, the group's committed offsets may be
// ahead of the positions by its commits, not by a loss.
func (p *Positions) Untracked(ctx context.Context, group string) ([]string, error) {
	rows, err := p.DB.pool.Query(ctx, `SELECT replica_id || ' (level ' || binary_level || ', seen '
	|| round(extract(epoch FROM now() - heartbeat_at)) || 's ago)'
FROM billing_replica WHERE consumer_group = $1 AND binary_level < $2 AND heartbeat_at > now() - make_interval(secs => $3)
ORDER BY replica_id`, group, PositionsFrom, migrations.ReplicaStaleAfter.Seconds())
	if err != nil {
		return nil, fmt.Errorf("replicas of group %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("replicas of group %s: %w", group, err)
	}
	return out, nil
}
