package migrate

// The replicas' side of the compatibility guard: CheckCompat reads how a
// binary stands with the schema, Register and Deregister keep the running
// replicas' rows that UpWith consults (breaking.go).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/db/migrations"
)

// q is what CheckCompat needs of a pool or a transaction.
type q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckCompat reads the schema version and its lowest compatible binary,
// for a binary of level migrations.Level(). It only reads; share makes it lock the
// record (FOR SHARE) so that a `migrate` raising it waits for the caller's
// transaction.
func CheckCompat(ctx context.Context, db q, share bool) (migrations.Compat, error) {
	c := migrations.Compat{Binary: migrations.Level()}
	err := db.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&c.Schema)
	if undefinedTable(err) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("schema version: %w", err)
	}
	lock := ""
	if share {
		lock = " FOR SHARE"
	}
	err = db.QueryRow(ctx, `SELECT lowest_binary FROM schema_compat`+lock).Scan(&c.Lowest)
	if undefinedTable(err) || errors.Is(err, pgx.ErrNoRows) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("lowest compatible binary: %w", err)
	}
	return c, nil
}

func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// Replica is a running `billing-consumer run` as it registered itself.
type Replica struct {
	ID, Version, Group string
	Level              int64
	Seen               time.Duration // since its last heartbeat
}

// Register checks the schema for this binary and, when the check passes,
// records (or refreshes) replica id as running this binary, in one
// transaction that holds the compatibility record FOR SHARE: a `migrate`
// that raises the record either waits and then sees this registration, or
// has raised it first and this check fails. Called at start and every
// HeartbeatInterval; a check that fails leaves no registration behind. The
// error is migrations.Compat.Err's when the schema does not accept this binary.
func Register(ctx context.Context, pool *pgxpool.Pool, id, version, group string) error {
	// A first look without the lock: a schema behind this binary may
	// have no tables to lock (and a failed statement would abort the
	// transaction).
	c, err := CheckCompat(ctx, pool, false)
	if err != nil {
		return err
	}
	if err := c.Err(); err != nil {
		if c.Schema >= migrations.FirstGuarded {
			if derr := Deregister(ctx, pool, id); derr != nil {
				return derr
			}
		}
		return err
	}
	var refused error
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		c, err := CheckCompat(ctx, tx, true)
		if err != nil {
			return err
		}
		if refused = c.Err(); refused != nil {
			_, err := tx.Exec(ctx, `DELETE FROM billing_replica WHERE replica_id = $1`, id)
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO billing_replica (replica_id, binary_level, version, consumer_group)
			VALUES ($1, $2, $3, $4)
			ON CONFLICT (replica_id) DO UPDATE SET binary_level = $2, version = $3, consumer_group = $4, heartbeat_at = now()`,
			id, c.Binary, version, group)
		return err
	})
	if err != nil {
		return err
	}
	return refused
}

// Deregister deletes replica id's registration: it no longer bills.
func Deregister(ctx context.Context, pool *pgxpool.Pool, id string) error {
	_, err := pool.Exec(ctx, `DELETE FROM billing_replica WHERE replica_id = $1`, id)
	return err
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
