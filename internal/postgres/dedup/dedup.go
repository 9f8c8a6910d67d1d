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

// Execer is the part of pgx.Tx (or pgx.Conn, pgxpool.Pool) that Unmark needs.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier is the part of pgx.Tx that MarkProcessed needs.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// noPartition recognizes Postgres' "no partition of relation found for row"
// (SQLSTATE 23514, check_violation, raised by the partition router).
func noPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.TableName == "processed_event"
}

// The insert sorts its rows, so that concurrent batches take their
// row locks in one order and cannot deadlock on each other.
const (
	markSQL = `INSERT INTO processed_event (event_id, consumer_group, processed_at)
SELECT id, $2, $3 FROM unnest($1::uuid[]) AS id ORDER BY id
ON CONFLICT DO NOTHING RETURNING event_id`
	unmarkSQL = `DELETE FROM processed_event WHERE event_id = ANY($1) AND consumer_group = $2`
)

// MarkProcessed inserts (eventID, group) for each of eventIDs, which must
// be distinct, into processed_event through tx, which must be the
// transaction that also writes the events' business results, so that both
// commit or neither does. It returns the events whose row is new; an
// event not among them was already processed by the group and must be
// skipped. A concurrent transaction inserting the same event makes this
// call wait until that transaction ends: only one of them sees it new. at
// is stored as processed_at.
//
// The error is ErrNoPartition (wrapped) when no partition holds one of
// the events: the whole statement failed.
func MarkProcessed(ctx context.Context, tx Querier, eventIDs []uuid.UUID, group string, at time.Time) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, markSQL, Binary(eventIDs), group, at)
	if err == nil {
		var fresh []uuid.UUID
		fresh, err = CollectUUIDs(rows)
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
	if _, err := tx.Exec(ctx, unmarkSQL, Binary(eventIDs), group); err != nil {
		return fmt.Errorf("unmark %d events: %w", len(eventIDs), err)
	}
	return nil
}

// Binary returns ids as pgx encodes a uuid[] natively, 16 bytes each.
// A uuid.UUID is a driver.Valuer, which pgx asks for its text form and
// parses back, for every element of every statement; a [16]byte goes
// straight into the binary protocol.
func Binary(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// CollectUUIDs reads rows of one uuid column and closes rows. Each is read
// in pgx's native binary form, into one [16]byte for all rows: scanned
// into a uuid.UUID, pgx would go through its sql.Scanner and the text
// form, and a destination per row would cost allocations per row.
func CollectUUIDs(rows pgx.Rows) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	var id [16]byte
	_, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		ids = append(ids, id)
		return nil
	})
	return ids, err
}
