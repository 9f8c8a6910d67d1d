package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// BenchmarkMarkProcessed marks a batch of 32 new events processed in a
// transaction that rolls back: one op is one statement of 32 rows.
func BenchmarkMarkProcessed(b *testing.B) {
	c := &clock{t: time.Now().UTC()}
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	if _, err := newMaintainer(pool, c).RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	ids := make([]uuid.UUID, 32)
	b.ReportAllocs()
	for b.Loop() {
		for i := range ids {
			ids[i] = events.IDAt(c.Now())
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		fresh, err := dedup.MarkProcessed(ctx, tx, ids, "bench", c.Now())
		if err != nil || len(fresh) != len(ids) {
			b.Fatalf("%d fresh, %v", len(fresh), err)
		}
		_ = tx.Rollback(ctx)
	}
}
