// Package migrations holds the SQL migrations of billing-consumer (the
// *.sql files beside this one, which operators and the docs name by
// path), embeds them as FS, and reads what the files declare: this
// binary's schema level (Level), each migration's lowest compatible
// binary (LowestBinaries, LowestCompatible) and how a binary stands with
// a schema (Compat). It runs no SQL and imports no database driver: the
// runner that applies the files and registers the running replicas is the
// Postgres adapter's (internal/postgres/migrate).
package migrations

import "embed"

// FS holds the embedded migrations, *.sql at its root, named
// NNNNN_name.sql (goose's version prefix).
//
//go:embed *.sql
var FS embed.FS
