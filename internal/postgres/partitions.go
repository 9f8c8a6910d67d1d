package postgres

// The dedup partitions' maintenance (package dedup) on a DB.

import "github.com/billing-consumer/billing-consumer/internal/postgres/dedup"

// NewMaintainer returns the dedup.Maintainer of db with the settings of
// m (its Pool is replaced by db's).
func NewMaintainer(db *DB, m dedup.Maintainer) *dedup.Maintainer {
	m.Pool = db.pool
	return &m
}
