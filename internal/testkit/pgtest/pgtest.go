// Package pgtest gives tests a fresh, migrated Postgres database of their
// own on the server named by BILLING_TEST_DATABASE_URL (make test and .ci/run
// start one with scripts/pg.sh and set it).
//
// Without that variable the tests that need Postgres are skipped on a
// developer's machine, and fail under CI=true, where a skip would hide that
// nothing was tested.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/postgres/migrate"
)

// EnvURL names the variable holding the URL of a database whose role may
// create databases.
const EnvURL = "BILLING_TEST_DATABASE_URL"

// AdminURL returns the server URL from EnvURL, skipping (or, under CI,
// failing) the test when it is unset.
func AdminURL(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(EnvURL)
	if admin == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the Postgres tests (use make test)", EnvURL)
		}
		t.Skipf("%s is not set; run make test, which starts Postgres", EnvURL)
	}
	return admin
}

// NewDatabase creates an empty database for this test and returns its URL.
// The database is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return NewDatabaseOn(t, AdminURL(t))
}

// NewDatabaseOn is NewDatabase on the server of admin, a URL whose role may
// create databases.
func NewDatabaseOn(t testing.TB, admin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to the admin database: %v", err)
	}
	defer conn.Close(ctx)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "test_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		// FORCE terminates the sessions left on the database; an autovacuum
		// worker there runs as no role, and terminating it needs
		// pg_signal_backend (scripts/pg.sh grants it), so a few tries.
		for try := 1; ; try++ {
			_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			if err == nil {
				return
			}
			if try == 5 {
				t.Errorf("drop database %s: %v", name, err)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("the admin database URL is not a URL")
	}
	u.Path = "/" + name
	return u.String()
}

// NewPool returns a pool on a fresh database with every migration applied.
// The pool is closed and the database dropped when the test ends.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := Open(t, NewDatabase(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := migrate.Up(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return pool
}

// Open returns a pool on url, closed when the test ends.
func Open(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	return pool
}
