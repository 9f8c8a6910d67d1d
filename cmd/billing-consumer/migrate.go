package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/migrate"
)

// migrateCommand is `billing-consumer migrate [--allow-breaking]`: apply
// the embedded migrations, then create the dedup partitions. A migration
// that raises the schema's lowest compatible binary above the level of a
// replica still registered as running is refused (one line naming the
// replicas) unless --allow-breaking; docs/operations.md (Upgrade) says
// which rollout each step needs.
func migrateCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // one line, as for every wrong command line
	allow := fs.Bool("allow-breaking", false,
		"apply a migration that breaks the older replicas still registered as running (they stop billing)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "Usage: billing-consumer migrate [--allow-breaking]\n\n%s\n", plainUsage["migrate"])
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return err
	} else if err != nil {
		return fmt.Errorf("migrate: %w (%w)", err, errUsage)
	}
	return withDB(ctx, fs.Args(), "migrate", stdout, stderr, func(ctx context.Context, cfg config, db *postgres.DB, logger *slog.Logger) error {
		n, err := postgres.Migrate(ctx, db, logger, migrate.Options{AllowBreaking: *allow})
		if err != nil {
			return err
		}
		logger.Info("migrations up to date", "applied", n, "binary_level", migrations.Level())
		// A fresh database gets its processed_event partitions now, before
		// any consumer starts: an event outside every partition is
		// decided by the ledger alone (SPEC §6).
		_, err = maintainer(cfg, db, logger).RunOnce(ctx)
		return err
	})
}
