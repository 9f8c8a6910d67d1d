package migrate_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/postgres/migrate"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// Two replicas starting at once both run migrate: one applies, the other
// waits on goose's advisory lock and finds nothing to do. Neither fails.
func TestUpConcurrentAndRepeated(t *testing.T) {
	url := pgtest.NewDatabase(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	const runners = 4
	applied := make([]int, runners)
	var wg sync.WaitGroup
	for i := range runners {
		pool := pgtest.Open(t, url) // one pool per "replica"
		wg.Go(func() {
			n, err := migrate.Up(context.Background(), pool, logger)
			if err != nil {
				t.Errorf("runner %d: %v", i, err)
			}
			applied[i] = n
		})
	}
	wg.Wait()
	total := 0
	for _, n := range applied {
		total += n
	}
	files, _ := filepath.Glob(sqlFiles)
	if total != len(files) {
		t.Fatalf("migrations applied across runners = %v; want each of the %d migrations applied exactly once", applied, len(files))
	}
	pool := pgtest.Open(t, url)
	if n, err := migrate.Up(context.Background(), pool, logger); err != nil || n != 0 {
		t.Fatalf("repeated Up = %d, %v; want 0, nil", n, err)
	}
	var tables int
	err := pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_tables WHERE tablename IN ('processed_event', 'charge')").Scan(&tables)
	if err != nil || tables != 2 {
		t.Fatalf("tables = %d, %v", tables, err)
	}
}

// CheckCompat reads schema version 0 on a database never migrated
// (without creating anything), and the latest embedded version after Up.
func TestSchemaVersion(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := pgtest.Open(t, url)
	ctx := context.Background()
	want := latestFile(t)
	c, err := migrate.CheckCompat(ctx, pool, false)
	cur, latest := c.Schema, c.Binary
	if err != nil || cur != 0 || latest != want {
		t.Fatalf("before migrate: CheckCompat = %d, %d, %v; want 0, %d, nil", cur, latest, err, want)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'goose_db_version'`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("CheckCompat created the goose table (%d, %v)", tables, err)
	}
	if _, err := migrate.Up(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	c, err = migrate.CheckCompat(ctx, pool, false)
	cur, latest = c.Schema, c.Binary
	if err != nil || cur != latest || latest != want {
		t.Fatalf("after migrate: CheckCompat = %d, %d, %v; want %d, %d, nil", cur, latest, err, want, want)
	}
}

// Versions reads 0 on a database never migrated (without creating
// anything), and the latest embedded version after Up.
func TestVersions(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool := pgtest.Open(t, url)
	ctx := context.Background()
	want := latestFile(t)
	cur, latest, err := migrate.Versions(ctx, pool)
	if err != nil || cur != 0 || latest != want {
		t.Fatalf("before migrate: Versions = %d, %d, %v; want 0, %d, nil", cur, latest, err, want)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'goose_db_version'`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("Versions created the goose table (%d, %v)", tables, err)
	}
	if _, err := migrate.Up(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	cur, latest, err = migrate.Versions(ctx, pool)
	if err != nil || cur != latest || latest != want {
		t.Fatalf("after migrate: Versions = %d, %d, %v; want %d, %d, nil", cur, latest, err, want, want)
	}
}

// sqlFiles are the migration files on disk, read apart from the embed.
var sqlFiles = filepath.Join("..", "..", "..", "db", "migrations", "*.sql")

// latestFile is the highest version prefix of the migration files: the
// numbers may have a gap while parallel branches hold theirs (00010
// before 00009 is merged).
func latestFile(t *testing.T) int64 {
	t.Helper()
	files, _ := filepath.Glob(sqlFiles)
	var latest int64
	for _, f := range files {
		f = filepath.Base(f)
		v, err := strconv.ParseInt(f[:strings.IndexByte(f, '_')], 10, 64)
		if err != nil {
			t.Fatalf("migration %s: %v", f, err)
		}
		latest = max(latest, v)
	}
	return latest
}
