package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/postgres/migrate"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// withNext is the embedded migrations plus a next release's migration at
// version migrations.Level()+1 declaring lowest compatible binary low.
func withNext(t *testing.T, low int64) (fs.FS, int64) {
	t.Helper()
	m := fstest.MapFS{}
	names, _ := fs.Glob(migrations.FS, "*.sql")
	for _, n := range names {
		b, _ := fs.ReadFile(migrations.FS, n)
		m[n] = &fstest.MapFile{Data: b}
	}
	v := migrations.Level() + 1
	m[fmt.Sprintf("%05d_next.sql", v)] = &fstest.MapFile{Data: fmt.Appendf(nil,
		"-- +goose Up\n-- lowest-compatible-binary: %d\nCREATE TABLE next_probe (a int);\n-- +goose Down\nDROP TABLE next_probe;\n", low)}
	return m, v
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func lowestOf(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	c, err := migrate.CheckCompat(context.Background(), pool, false)
	if err != nil {
		t.Fatal(err)
	}
	return c.Lowest
}

// TestBreakingStepRefusedWhileOlderReplicaRuns: a migration that raises
// the lowest compatible binary above a running replica's level is refused
// (nothing applied, nothing raised) while the replica's heartbeat is
// fresh; applied once it is stale, or with AllowBreaking, after which the
// replica's next heartbeat is refused and deletes its registration. An
// additive one is applied beside it.
func TestBreakingStepRefusedWhileOlderReplicaRuns(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Open(t, pgtest.NewDatabase(t))
	if _, err := migrate.Up(ctx, pool, quietLogger()); err != nil {
		t.Fatal(err)
	}
	if err := migrate.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatalf("register on its own schema: %v", err)
	}
	additive, _ := withNext(t, 3)
	if n, err := migrate.UpFS(ctx, pool, additive, quietLogger(), migrate.Options{}); err != nil || n != 1 {
		t.Fatalf("additive step beside a running replica: %d, %v; want applied", n, err)
	}
	if err := migrate.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatalf("heartbeat on a newer schema that accepts this binary: %v", err)
	}

	pool = pgtest.Open(t, pgtest.NewDatabase(t))
	if _, err := migrate.Up(ctx, pool, quietLogger()); err != nil {
		t.Fatal(err)
	}
	if err := migrate.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatal(err)
	}
	breaking, v := withNext(t, migrations.Level()+1)
	before := lowestOf(t, pool)
	_, err := migrate.UpFS(ctx, pool, breaking, quietLogger(), migrate.Options{})
	var be *migrate.BreakingError
	if !errors.As(err, &be) || be.Version != v || len(be.Running) != 1 || be.Running[0].ID != "old-1" {
		t.Fatalf("breaking step with a running replica: %v; want a migrate.BreakingError naming old-1", err)
	}
	t.Logf("refused: %v", err)
	if c, _ := migrate.CheckCompat(ctx, pool, false); c.Schema != migrations.Level() || c.Lowest != before {
		t.Fatalf("after the refusal: %+v; want the schema and its record unchanged", c)
	}

	// A stale heartbeat (a SIGKILLed replica) no longer counts.
	if _, err := pool.Exec(ctx, `UPDATE billing_replica SET heartbeat_at = now() - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	if n, err := migrate.UpFS(ctx, pool, breaking, quietLogger(), migrate.Options{}); err != nil || n != 1 {
		t.Fatalf("breaking step once the replica is stale: %d, %v", n, err)
	}
	if got := lowestOf(t, pool); got != v {
		t.Fatalf("lowest compatible binary %d, want %d", got, v)
	}
	err = migrate.Register(ctx, pool, "old-1", "v-old", "billing")
	var inc *migrations.IncompatibleError
	if !errors.As(err, &inc) {
		t.Fatalf("heartbeat of a level-%d replica on a schema that needs %d: %v, want migrations.IncompatibleError", migrations.Level(), v, err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM billing_replica`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("registrations left after the refusal: %d, %v; want 0", left, err)
	}
}

// TestAllowBreaking: with AllowBreaking the step is applied beside the
// running older replica.
func TestAllowBreaking(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Open(t, pgtest.NewDatabase(t))
	if _, err := migrate.Up(ctx, pool, quietLogger()); err != nil {
		t.Fatal(err)
	}
	if err := migrate.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatal(err)
	}
	breaking, v := withNext(t, migrations.Level()+1)
	if n, err := migrate.UpFS(ctx, pool, breaking, quietLogger(), migrate.Options{AllowBreaking: true}); err != nil || n != 1 {
		t.Fatalf("--allow-breaking: %d, %v", n, err)
	}
	if got := lowestOf(t, pool); got != v {
		t.Fatalf("lowest compatible binary %d, want %d", got, v)
	}
}
