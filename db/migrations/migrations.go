// Package migrations embeds the SQL migrations of billing-consumer and
// applies them with goose.
//
// Up is safe to run from several replicas at once: goose holds a Postgres
// advisory lock for the whole run, so a second runner waits, then finds
// nothing left to apply.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// Up applies every pending migration through pool and logs each one
// applied. It returns the number applied.
func Up(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return 0, fmt.Errorf("migration lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return 0, fmt.Errorf("load migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return 0, fmt.Errorf("apply migrations: %w", err)
	}
	for _, r := range results {
		logger.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration.String())
	}
	return len(results), nil
}

// Versions returns the schema version the database has (the highest
// applied migration, 0 before the first) and the latest this binary
// embeds. It only reads: a database that was never migrated has no goose
// table and is at version 0.
func Versions(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return 0, 0, err
	}
	for _, n := range names {
		v, err := strconv.ParseInt(n[:strings.IndexByte(n, '_')], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("migration file %s: no version prefix", n)
		}
		latest = max(latest, v)
	}
	err = pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&current)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" /* undefined_table */ {
		return 0, latest, nil
	}
	if err != nil {
		return 0, latest, fmt.Errorf("schema version: %w", err)
	}
	return current, latest, nil
}
