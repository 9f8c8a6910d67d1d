// Package pglock takes Postgres session advisory locks, with which one
// replica at a time does a periodic job (dedup partition maintenance, the
// ledger completer) while the others skip it.
package pglock

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TryLock tries to take the session advisory lock key on conn, without
// waiting for another holder, within timeout. When locked, unlock releases
// it; a session lock outlives the connection's return to the pool, so when
// the release fails unlock closes the connection, which releases it (conn
// must then not be used again; Release on it is a no-op). unlock is bounded
// by timeout too and runs even when ctx has ended.
func TryLock(ctx context.Context, conn *pgxpool.Conn, key int64, timeout time.Duration) (unlock func(), locked bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := conn.QueryRow(lctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&locked); err != nil || !locked {
		return nil, false, err
	}
	return func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
			_ = conn.Hijack().Close(uctx)
		}
	}, true, nil
}
