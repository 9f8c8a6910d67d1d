// Package dedup is the processed_event store: it records, inside the
// caller's transaction, that a consumer group has finished an event, and it
// keeps the table's day partitions (create ahead, drop when expired).
//
// Dedup is keyed on the event's UUIDv7 event_id, never on a Kafka offset:
// offsets are reused after a topic is recreated and differ when a producer
// resends an event, while the event_id is the event's identity.
package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoPartition means the event's UUIDv7 time falls outside every
// processed_event partition: older than the retention period, or further
// ahead than the partitions created so far. The insert has failed and
// aborted the caller's transaction; the caller must roll back and decide the
// event by the charge ledger alone (SPEC §6).
var ErrNoPartition = errors.New("event time outside the processed_event partitions")

// Execer is the part of pgx.Tx (or pgx.Conn, pgxpool.Pool) that
// MarkProcessed and Unmark need.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier is the part of pgx.Tx that MarkProcessedBatch needs.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

const markSQL = `INSERT INTO processed_event (event_id, consumer_group, processed_at)
VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`

// MarkProcessed inserts (eventID, group) into processed_event through tx,
// which must be the transaction that also writes the event's business
// result, so that both commit or neither does. It reports whether the row
// is new: false means the group has already processed the event and the
// caller must skip it. A concurrent transaction inserting the same event
// makes this call wait until that transaction ends: only one of them sees
// true. at is stored as processed_at.
//
// The error is ErrNoPartition (wrapped) when no partition holds the event.
func MarkProcessed(ctx context.Context, tx Execer, eventID uuid.UUID, group string, at time.Time) (bool, error) {
	tag, err := tx.Exec(ctx, markSQL, eventID, group, at)
	if err != nil {
		if noPartition(err) {
			return false, fmt.Errorf("mark event %s processed: %w", eventID, ErrNoPartition)
		}
		return false, fmt.Errorf("mark event %s processed: %w", eventID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// noPartition recognizes Postgres' "no partition of relation found for row"
// (SQLSTATE 23514, check_violation, raised by the partition router).
func noPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.TableName == "processed_event"
}

// The batch insert sorts its rows, so that concurrent batches take their
// row locks in one order and cannot deadlock on each other.
const (
	markBatchSQL = `INSERT INTO processed_event (event_id, consumer_group, processed_at)
SELECT id, $2, $3 FROM unnest($1::uuid[]) AS id ORDER BY id
ON CONFLICT DO NOTHING RETURNING event_id`
	unmarkSQL = `DELETE FROM processed_event WHERE event_id = ANY($1) AND consumer_group = $2`
)

// MarkProcessedBatch is MarkProcessed for several distinct events in one
// statement: it returns those whose row is new. One event outside every
// partition fails the whole statement with ErrNoPartition (wrapped).
func MarkProcessedBatch(ctx context.Context, tx Querier, eventIDs []uuid.UUID, group string, at time.Time) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, markBatchSQL, eventIDs, group, at)
	if err == nil {
		var fresh []uuid.UUID
		fresh, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err == nil {
			return fresh, nil
		}
	}
	if noPartition(err) {
		return nil, fmt.Errorf("mark %d events processed: %w", len(eventIDs), ErrNoPartition)
	}
	return nil, fmt.Errorf("mark %d events processed: %w", len(eventIDs), err)
}

// Unmark deletes, in tx, the processed_event rows of eventIDs that tx
// inserted: in a transaction that commits other events' results, it undoes
// the mark of the events that did not finish, so that a retry or a replay
// processes them afresh.
func Unmark(ctx context.Context, tx Execer, eventIDs []uuid.UUID, group string) error {
	if _, err := tx.Exec(ctx, unmarkSQL, eventIDs, group); err != nil {
		return fmt.Errorf("unmark %d events: %w", len(eventIDs), err)
	}
	return nil
}
