package main

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// weak tells whether d shows that an acknowledged commit may be on the
// primary alone: no synchronous standby, or a synchronous_commit that does
// not wait for one. Without that, a failover loses the last acknowledged
// commits, whose offsets Kafka already holds, and charges their orders
// again (docs/operations.md, Durability requirement). (A managed offering
// whose storage is synchronous shows no standby either: the log line says
// so.)
func weak(d postgres.Durability) bool {
	return d.SyncStandbys == 0 || d.SynchronousCommit == "off" || d.SynchronousCommit == "local"
}

// durabilityAttrs are the fields of the startup line; the standbys read
// "unknown" when hidden.
func durabilityAttrs(d postgres.Durability) []any {
	standbys := "unknown"
	if d.SyncStandbys >= 0 {
		standbys = strconv.Itoa(d.SyncStandbys)
	}
	return []any{"synchronous_commit", d.SynchronousCommit, "synchronous_standby_names", d.SynchronousStandbyNames,
		"sync_standbys", standbys}
}

// checkDurability is a startup step: it reads durability, exports it
// (billing_postgres_synchronous_commit, billing_postgres_sync_standbys) and
// logs it in one line, "database durability", a warning (with a field
// "warning" saying why) when it is weak. It never holds the
// startup: a failed read is logged and leaves the gauges unknown.
func (s *service) checkDurability(ctx context.Context) error {
	d, err := postgres.ReadDurability(ctx, s.db)
	if err != nil {
		s.logger.Warn("could not read the database's durability settings", "err", err.Error())
		return nil
	}
	s.durable.Set(d.SynchronousCommit, d.SyncStandbys)
	level, attrs := slog.LevelInfo, durabilityAttrs(d)
	if weak(d) {
		level = slog.LevelWarn
		attrs = append(attrs, "warning", "an acknowledged commit may live on the primary alone, and a failover that loses it "+
			"can charge orders twice, unless the storage itself is synchronous (docs/operations.md, Durability requirement)")
	}
	s.logger.Log(ctx, level, "database durability", attrs...)
	return nil
}
