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
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoPartition means the event's UUIDv7 time falls outside every
// processed_event partition: older than the retention period, or further
// ahead than the partitions created so far. The insert has failed and
// aborted the caller's transaction; the caller must roll back and decide the
// event by the charge ledger alone (SPEC §6).
var ErrNoPartition = errors.New("event time outside the processed_event partitions")

// Execer is the part of pgx.Tx (or pgx.Conn, pgxpool.Pool) that
// MarkProcessed needs.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
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
