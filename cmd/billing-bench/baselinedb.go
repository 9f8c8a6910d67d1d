package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"
)

// baselineDB is the scratch database the -baseline binary bills into,
// next to BILLING_DATABASE_URL's, migrated by the baseline binary itself:
// a binary refuses a schema newer than it understands (the schema
// compatibility guard), so the code before a change that adds a migration
// cannot run on the database of the code after it.
const baselineDB = "billing_bench_baseline"

// openBaselineDB drops and recreates baselineDB, migrates it with bin and
// returns its URL and a pool on it; close calls drop it again.
func openBaselineDB(ctx context.Context, o options, admin *pgxpool.Pool, bin string, log io.Writer) (string, *pgxpool.Pool, func(), error) {
	u, err := url.Parse(o.dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", nil, nil, errors.New("BILLING_DATABASE_URL must be a postgres:// URL for the baseline's scratch database")
	}
	u.Path = "/" + baselineDB
	scratch := u.String()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+baselineDB+" WITH (FORCE)"); err != nil {
		return "", nil, nil, fmt.Errorf("drop %s: %w", baselineDB, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+baselineDB); err != nil {
		return "", nil, nil, fmt.Errorf("create %s: %w", baselineDB, err)
	}
	drop := func() {
		_, _ = admin.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+baselineDB+" WITH (FORCE)")
	}
	for _, command := range []string{"migrate", "retention"} {
		if err := runOnce(ctx, bin, []string{"BILLING_DATABASE_URL=" + scratch}, log, command); err != nil {
			drop()
			return "", nil, nil, fmt.Errorf("baseline: %w", err)
		}
	}
	pool, err := pgxpool.New(ctx, scratch)
	if err != nil {
		drop()
		return "", nil, nil, fmt.Errorf("open %s: %w", baselineDB, err)
	}
	return scratch, pool, func() { pool.Close(); drop() }, nil
}
