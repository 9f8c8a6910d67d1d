package main

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
)

// durability is what the service's database role can see of the ledger's
// durability: whether a commit the service is told of has reached a
// standby that a failover would promote. Without that, a failover loses
// the last acknowledged commits, whose offsets Kafka already holds, and
// charges their orders again (docs/operations.md, Durability requirement).
type durability struct {
	// synchronousCommit and synchronousStandbyNames are the settings of
	// the role's sessions (readable by any role).
	synchronousCommit, synchronousStandbyNames string
	// syncStandbys counts the standbys pg_stat_replication shows in
	// sync_state sync or quorum; -1 when the role may not see the column
	// (without pg_read_all_stats, other roles' walsenders show no details).
	syncStandbys int
}

// durabilitySQL reads durability in one statement. hidden counts the
// walsenders whose details the role may not see.
const durabilitySQL = `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')), count(*) FILTER (WHERE sync_state IS NULL)
FROM pg_stat_replication`

// readDurability runs durabilitySQL on pool.
func readDurability(ctx context.Context, pool *pgxpool.Pool) (durability, error) {
	var d durability
	var sync, hidden int
	err := pool.QueryRow(ctx, durabilitySQL).Scan(&d.synchronousCommit, &d.synchronousStandbyNames, &sync, &hidden)
	d.syncStandbys = syncStandbys(sync, hidden)
	return d, err
}

// syncStandbys is the synchronous standbys seen: sync, or -1 (unknown)
// when some walsender's state is hidden from the role.
func syncStandbys(sync, hidden int) int {
	if hidden > 0 {
		return -1
	}
	return sync
}

// weak tells whether d shows that an acknowledged commit may be on the
// primary alone: no synchronous standby, or a synchronous_commit that does
// not wait for one. (A managed offering whose storage is synchronous shows
// no standby either: the log line says so.)
func (d durability) weak() bool {
	return d.syncStandbys == 0 || d.synchronousCommit == "off" || d.synchronousCommit == "local"
}

// logAttrs are the fields of the startup line; the standbys read
// "unknown" when hidden.
func (d durability) logAttrs() []any {
	standbys := "unknown"
	if d.syncStandbys >= 0 {
		standbys = strconv.Itoa(d.syncStandbys)
	}
	return []any{"synchronous_commit", d.synchronousCommit, "synchronous_standby_names", d.synchronousStandbyNames,
		"sync_standbys", standbys}
}

// checkDurability is a startup step: it reads durability, exports it
// (billing_postgres_synchronous_commit, billing_postgres_sync_standbys) and
// logs it in one line, "database durability", a warning (with a field
// "warning" saying why) when it is weak. It never holds the
// startup: a failed read is logged and leaves the gauges unknown.
func (s *service) checkDurability(ctx context.Context) error {
	d, err := readDurability(ctx, s.pool)
	if err != nil {
		s.logger.Warn("could not read the database's durability settings", "err", err.Error())
		return nil
	}
	s.durable.Set(d.synchronousCommit, d.syncStandbys)
	level, attrs := slog.LevelInfo, d.logAttrs()
	if d.weak() {
		level = slog.LevelWarn
		attrs = append(attrs, "warning", "an acknowledged commit may live on the primary alone, and a failover that loses it "+
			"can charge orders twice, unless the storage itself is synchronous (docs/operations.md, Durability requirement)")
	}
	s.logger.Log(ctx, level, "database durability", attrs...)
	return nil
}
