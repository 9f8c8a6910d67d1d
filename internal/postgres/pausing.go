package postgres

// The operator's pause (package pause) on a DB: the program's entry
// points to it, which work on the pool.

import (
	"context"
	"log/slog"

	"github.com/billing-consumer/billing-consumer/internal/postgres/pause"
)

// Pause pauses group (pause.Set) and returns the pause now in force.
func Pause(ctx context.Context, db *DB, group, reason, operator, host string) (pause.State, error) {
	return pause.Set(ctx, db.pool, group, reason, operator, host)
}

// Resume ends the pause of group (pause.Clear) and returns the pause it
// ended, the zero State when the group was not paused.
func Resume(ctx context.Context, db *DB, group string) (pause.State, error) {
	return pause.Clear(ctx, db.pool, group)
}

// PauseOf reads the pause of group (pause.Get); the zero State when it is
// not paused.
func PauseOf(ctx context.Context, db *DB, group string) (pause.State, error) {
	return pause.Get(ctx, db.pool, group)
}

// NewPauseWatcher returns the pause.Watcher of group on db; onState, when
// set, is called after each successful read.
func NewPauseWatcher(db *DB, group string, logger *slog.Logger, onState func(pause.State)) *pause.Watcher {
	return &pause.Watcher{Pool: db.pool, Group: group, Logger: logger, OnState: onState}
}
