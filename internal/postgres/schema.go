package postgres

// The schema's migrations and the replicas' registration on a DB: the
// program's entry points to package migrate, which works on the pool.

import (
	"context"
	"log/slog"

	"github.com/billing-consumer/billing-consumer/internal/postgres/migrate"
)

// Migrate applies every pending embedded migration (migrate.UpWith): it
// returns the number applied; a refusal to break running replicas is a
// *migrate.BreakingError. Safe to run from several replicas at once.
func Migrate(ctx context.Context, db *DB, logger *slog.Logger, opts migrate.Options) (int, error) {
	return migrate.UpWith(ctx, db.pool, logger, opts)
}

// SchemaVersions returns the database's schema version (0 before the
// first migration) and this binary's level (migrate.Versions). It only
// reads.
func SchemaVersions(ctx context.Context, db *DB) (current, latest int64, err error) {
	return migrate.Versions(ctx, db.pool)
}

// RegisterReplica checks the schema for this binary and registers (or
// refreshes) replica id as running it (migrate.Register); the error is
// migrations.Compat.Err's when the schema does not accept this binary.
func RegisterReplica(ctx context.Context, db *DB, id, version, group string) error {
	return migrate.Register(ctx, db.pool, id, version, group)
}

// DeregisterReplica deletes replica id's registration (migrate.Deregister).
func DeregisterReplica(ctx context.Context, db *DB, id string) error {
	return migrate.Deregister(ctx, db.pool, id)
}
