package heal_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// Review 2 (low): the server's identity is pg_postmaster_start_time()::text,
// which the session's TimeZone renders: a new default time zone for the
// database or the role (ALTER DATABASE/ROLE ... SET timezone) makes the
// next connection to the same server "another server", so the replica
// drops its uncommitted progress and reads Kafka again for nothing.
func TestSameServerOtherTimeZoneIsNotANewServer(t *testing.T) {
	w := newWorld(t, nil)
	var drops atomic.Int32
	h := heal.New(heal.Config{Group: w.group, Topic: w.topic, Client: w.client,
		Reader: kafkagroup.ReaderConfig{Brokers: w.brokers, Topic: w.topic}, Replica: "test",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnNewServer: func() { drops.Add(1) }})
	pc, err := pgxpool.ParseConfig(w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.AfterConnect = postgres.HealOnConnect(h, w.group, w.topic)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	var db string
	if err := w.db.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := w.db.Exec(ctx, `ALTER DATABASE "`+db+`" SET timezone = 'Asia/Tokyo'`); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // a recycled connection (pgx's lifetimes)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if n := drops.Load(); n != 0 {
		t.Errorf("the same server, a new default time zone: OnNewServer called %d time(s) (the consumer's Drop); want 0", n)
	}
}
