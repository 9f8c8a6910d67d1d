package billing_test

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// The adapter, for billing's internal tests (see billing.StoreOn).
func init() {
	billing.StoreOn = func(db billing.TestDB) billing.TestStore { return postgres.NewStoreOn(db) }
	billing.SessionsOn = func(pool *pgxpool.Pool) billing.Sessions { return postgres.NewSessions(postgres.FromPool(pool)) }
}
