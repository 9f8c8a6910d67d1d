package migrate

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/db/migrations"
)

// BreakingError is UpWith's refusal to apply migration Version, which
// accepts binaries of level Lowest or later only, while Running replicas
// of a lower level are registered as running.
type BreakingError struct {
	Version, Lowest int64
	Running         []Replica
}

func (e *BreakingError) Error() string {
	rs := make([]string, len(e.Running))
	for i, r := range e.Running {
		rs[i] = fmt.Sprintf("%s (level %d, %s, seen %.0fs ago)", r.ID, r.Level, r.Version, r.Seen.Seconds())
	}
	return fmt.Sprintf("migration %05d breaks binaries below schema level %d, and %d such replicas run: %s; "+
		"stop them first (stop-then-start, docs/operations.md Upgrade), or pass --allow-breaking",
		e.Version, e.Lowest, len(e.Running), strings.Join(rs, ", "))
}

// raiseLowest records, before migration v is applied, that the schema
// accepts binaries of level low or later, if it records a lower level. It
// holds the record FOR UPDATE while it reads the running replicas, so a
// replica registering meanwhile (Register holds it FOR SHARE) is either
// seen here or sees the raised level. Below migrations.FirstGuarded there is no
// record yet: nothing to do.
func raiseLowest(ctx context.Context, pool *pgxpool.Pool, v, low int64, opts Options, logger *slog.Logger) error {
	if v <= migrations.FirstGuarded {
		return nil
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var cur int64
		if err := tx.QueryRow(ctx, `SELECT lowest_binary FROM schema_compat FOR UPDATE`).Scan(&cur); err != nil {
			return fmt.Errorf("lowest compatible binary: %w", err)
		}
		if low <= cur {
			return nil
		}
		rows, err := tx.Query(ctx, `SELECT replica_id, binary_level, version, consumer_group,
				extract(epoch FROM now() - heartbeat_at)::float8
			FROM billing_replica WHERE binary_level < $1 AND heartbeat_at > now() - make_interval(secs => $2)
			ORDER BY replica_id`, low, migrations.ReplicaStaleAfter.Seconds())
		if err != nil {
			return fmt.Errorf("running replicas: %w", err)
		}
		running, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Replica, error) {
			var rep Replica
			var seen float64
			err := r.Scan(&rep.ID, &rep.Level, &rep.Version, &rep.Group, &seen)
			rep.Seen = secondsDuration(seen)
			return rep, err
		})
		if err != nil {
			return fmt.Errorf("running replicas: %w", err)
		}
		if len(running) > 0 {
			be := &BreakingError{Version: v, Lowest: low, Running: running}
			if !opts.AllowBreaking {
				return be
			}
			logger.Warn("applying a breaking migration while older replicas run (--allow-breaking): they stop billing at their next heartbeat",
				"version", v, "lowest_binary", low, "running", be.Error())
		}
		if _, err := tx.Exec(ctx, `UPDATE schema_compat SET lowest_binary = $1, updated_at = now()`, low); err != nil {
			return fmt.Errorf("raise lowest compatible binary: %w", err)
		}
		logger.Info("lowest compatible binary raised", "version", v, "lowest_binary", low, "was", cur)
		return nil
	})
}
