// Package migrate applies billing-consumer's SQL migrations (db/migrations,
// embedded as migrations.FS) with goose, and guards the schema's
// compatibility with the binaries that run against it: each migration from
// 00004 on declares the lowest binary level it accepts (read by package
// migrations), running replicas register their level (register.go), and
// UpWith refuses a step that would break one of them (breaking.go). It is
// part of the Postgres adapter; the rest of the program reaches it through
// package postgres (postgres.Migrate and its neighbours).
//
// Up is safe to run from several replicas at once: goose holds a Postgres
// advisory lock while it applies each migration, so a second runner waits,
// then finds nothing left to apply.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/billing-consumer/billing-consumer/db/migrations"
)

// Up is UpWith without AllowBreaking.
func Up(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int, error) {
	return UpWith(ctx, pool, logger, Options{})
}

// Options of UpWith.
type Options struct {
	// AllowBreaking applies a migration that raises the lowest compatible
	// binary above the level of replicas still registered as running
	// (they stop billing at their next heartbeat, within
	// HeartbeatInterval); without it UpWith refuses with a *BreakingError.
	AllowBreaking bool
}

// UpWith applies every pending migration through pool, one at a time, and
// logs each one applied. Before a migration that declares a higher lowest
// compatible binary than the schema records (see breaking.go), it raises the
// record, so that no binary it breaks may bill once the migration is in
// (intent before effect: if the migration then fails, the binaries below
// the new level stay stopped, and the newer ones wait for migrate). It
// returns the number applied; a refusal is a *BreakingError.
func UpWith(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, opts Options) (int, error) {
	return up(ctx, pool, migrations.FS, logger, opts)
}

func up(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, logger *slog.Logger, opts Options) (int, error) {
	lowest, err := migrations.LowestBinaries(fsys)
	if err != nil {
		return 0, err
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return 0, fmt.Errorf("migration lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithSessionLocker(locker))
	if err != nil {
		return 0, fmt.Errorf("load migrations: %w", err)
	}
	status, err := provider.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("migration status: %w", err)
	}
	applied := 0
	for _, st := range status {
		if st.State != goose.StatePending {
			continue
		}
		v := st.Source.Version
		if err := raiseLowest(ctx, pool, v, lowest[v], opts, logger); err != nil {
			return applied, err
		}
		results, err := provider.UpTo(ctx, v)
		if err != nil {
			return applied, fmt.Errorf("apply migrations: %w", err)
		}
		for _, r := range results {
			logger.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration.String())
		}
		applied += len(results)
	}
	return applied, nil
}

// Versions returns the schema version the database has (the highest
// applied migration, 0 before the first) and the latest this binary
// embeds (its level). It only reads: a database that was never migrated
// has no goose table and is at version 0. The one-shot commands use it to
// say "run migrate"; run checks more (CheckCompat, Register).
func Versions(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	c, err := CheckCompat(ctx, pool, false)
	return c.Schema, c.Binary, err
}
