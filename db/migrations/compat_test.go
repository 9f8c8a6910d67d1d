package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// TestEmbeddedDirectives: every migration from 00004 on declares its
// lowest compatible binary, and none declares one above its own version.
func TestEmbeddedDirectives(t *testing.T) {
	low, err := migrations.LowestBinaries(migrations.Embedded)
	if err != nil {
		t.Fatal(err)
	}
	if got := migrations.LowestCompatible(); got < 3 || got > migrations.Level() {
		t.Errorf("LowestCompatible() = %d, want between 3 and %d", got, migrations.Level())
	}
	if low[4] != 3 {
		t.Errorf("00004 declares lowest compatible binary %d, want 3 (it only adds tables)", low[4])
	}
}

func TestDirectiveRules(t *testing.T) {
	for name, sql := range map[string]string{
		"missing":  "-- +goose Up\nCREATE TABLE x (a int);\n",
		"twice":    "-- lowest-compatible-binary: 4\n-- lowest-compatible-binary: 5\n",
		"too high": "-- lowest-compatible-binary: 6\n",
		"zero":     "-- lowest-compatible-binary: 0\n",
	} {
		if _, err := migrations.LowestBinaries(fstest.MapFS{"00005_x.sql": {Data: []byte(sql)}}); err == nil {
			t.Errorf("%s: accepted %q", name, sql)
		}
	}
	low, err := migrations.LowestBinaries(fstest.MapFS{"00003_old.sql": {Data: []byte("no line before 00004")},
		"00005_x.sql": {Data: []byte("-- +goose Up\n-- lowest-compatible-binary: 5\n")}})
	if err != nil || low[5] != 5 || len(low) != 1 {
		t.Errorf("lowestBinaries = %v, %v; want map[5:5]", low, err)
	}
}

func TestCompatErr(t *testing.T) {
	for _, c := range []struct {
		migrations.Compat
		want string // "" for nil
	}{
		{migrations.Compat{Schema: 4, Binary: 4, Lowest: 3}, ""},
		{migrations.Compat{Schema: 7, Binary: 4, Lowest: 4}, ""}, // newer, still accepts level 4
		{migrations.Compat{Schema: 3, Binary: 4, Lowest: 0}, "run billing-consumer migrate"},
		{migrations.Compat{Schema: 0, Binary: 4}, "run billing-consumer migrate"},
		{migrations.Compat{Schema: 5, Binary: 4, Lowest: 5}, "refusing to bill"},
		// The record raised, its migration not (yet) applied.
		{migrations.Compat{Schema: 4, Binary: 4, Lowest: 5}, "refusing to bill"},
	} {
		err := c.Err()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: Err() = %v, want %q", c.Compat, err, c.want)
		}
		var inc *migrations.IncompatibleError
		if errors.As(err, &inc) != (c.want == "refusing to bill") {
			t.Errorf("%+v: migrations.IncompatibleError %v", c.Compat, err)
		}
	}
}

// withNext is the embedded migrations plus a next release's migration at
// version migrations.Level()+1 declaring lowest compatible binary low.
func withNext(t *testing.T, low int64) (fs.FS, int64) {
	t.Helper()
	m := fstest.MapFS{}
	names, _ := fs.Glob(migrations.Embedded, "*.sql")
	for _, n := range names {
		b, _ := fs.ReadFile(migrations.Embedded, n)
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
	c, err := migrations.CheckCompat(context.Background(), pool, false)
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
	if _, err := migrations.Up(ctx, pool, quietLogger()); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatalf("register on its own schema: %v", err)
	}
	additive, _ := withNext(t, 3)
	if n, err := migrations.UpFS(ctx, pool, additive, quietLogger(), migrations.Options{}); err != nil || n != 1 {
		t.Fatalf("additive step beside a running replica: %d, %v; want applied", n, err)
	}
	if err := migrations.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatalf("heartbeat on a newer schema that accepts this binary: %v", err)
	}

	pool = pgtest.Open(t, pgtest.NewDatabase(t))
	if _, err := migrations.Up(ctx, pool, quietLogger()); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatal(err)
	}
	breaking, v := withNext(t, migrations.Level()+1)
	before := lowestOf(t, pool)
	_, err := migrations.UpFS(ctx, pool, breaking, quietLogger(), migrations.Options{})
	var be *migrations.BreakingError
	if !errors.As(err, &be) || be.Version != v || len(be.Running) != 1 || be.Running[0].ID != "old-1" {
		t.Fatalf("breaking step with a running replica: %v; want a migrations.BreakingError naming old-1", err)
	}
	t.Logf("refused: %v", err)
	if c, _ := migrations.CheckCompat(ctx, pool, false); c.Schema != migrations.Level() || c.Lowest != before {
		t.Fatalf("after the refusal: %+v; want the schema and its record unchanged", c)
	}

	// A stale heartbeat (a SIGKILLed replica) no longer counts.
	if _, err := pool.Exec(ctx, `UPDATE billing_replica SET heartbeat_at = now() - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	if n, err := migrations.UpFS(ctx, pool, breaking, quietLogger(), migrations.Options{}); err != nil || n != 1 {
		t.Fatalf("breaking step once the replica is stale: %d, %v", n, err)
	}
	if got := lowestOf(t, pool); got != v {
		t.Fatalf("lowest compatible binary %d, want %d", got, v)
	}
	err = migrations.Register(ctx, pool, "old-1", "v-old", "billing")
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
	if _, err := migrations.Up(ctx, pool, quietLogger()); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Register(ctx, pool, "old-1", "v-old", "billing"); err != nil {
		t.Fatal(err)
	}
	breaking, v := withNext(t, migrations.Level()+1)
	if n, err := migrations.UpFS(ctx, pool, breaking, quietLogger(), migrations.Options{AllowBreaking: true}); err != nil || n != 1 {
		t.Fatalf("--allow-breaking: %d, %v", n, err)
	}
	if got := lowestOf(t, pool); got != v {
		t.Fatalf("lowest compatible binary %d, want %d", got, v)
	}
}
