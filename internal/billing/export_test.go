package billing

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/events"
)

// ProcessBatch bills evs as one batch of the Batcher does (one claim
// statement, one charge transaction, the charges in parallel), for the
// contract tests that must place several chosen events in one batch: the
// Batcher's own loop batches whatever happens to be queued. evs[victim]
// runs under ctx's attempt (see WithAttempt); the others are attempts of
// their own. It answers each event, in order.
func ProcessBatch(ctx context.Context, s *Service, evs []events.OrderConfirmed, victim int) ([]Result, []error) {
	atts := make([]*attempt, len(evs))
	for i := range evs {
		atts[i] = &attempt{id: attemptOf(context.Background()).id}
	}
	atts[victim] = attemptOf(ctx)
	out := s.processAll(ctx, evs, atts, nil)
	res, errs := make([]Result, len(out)), make([]error, len(out))
	for i, r := range out {
		res[i], errs[i] = r.res, r.err
	}
	return res, errs
}

// The internal tests that run billing's statements on a real Postgres
// (the conformance test, the lock-order and the stray-record tests) need
// the adapter, internal/postgres, which imports billing: a test of
// package billing cannot import it. adapter_test.go, of package
// billing_test and compiled into the same test binary, sets these to the
// adapter's constructors before any test runs.
var (
	// StoreOn is postgres.NewStoreOn.
	StoreOn func(db TestDB) TestStore
	// SessionsOn is postgres.NewSessions of postgres.FromPool(pool).
	SessionsOn func(pool *pgxpool.Pool) Sessions
)

// TestDB is a pool or a transaction, as the adapter takes it
// (postgres.Conn).
type TestDB = interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// TestStore is what the adapter's Store implements.
type TestStore interface {
	Store
	OperatorStore
}

// storeOn returns the adapter's Store on db.
func storeOn(t testing.TB, db TestDB) TestStore {
	t.Helper()
	if StoreOn == nil {
		t.Fatal("billing.StoreOn is not set (adapter_test.go)")
	}
	return StoreOn(db)
}
