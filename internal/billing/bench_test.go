package billing_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
	"github.com/billing-consumer/billing-consumer/internal/postgres/migrate"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The benchmarks bill events against a real Postgres with a charger that
// answers at once, so that what they measure is billing's own cost: CPU,
// allocations and statements (round trips) per event. They report
// stmts/event (every statement pgx sends, BEGIN and COMMIT included) and,
// for the Batcher, events/batch.

// statementCounter is a pgx tracer counting the statements sent.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// benchPool returns a pool on a fresh, migrated database with partitions
// around the real clock, and the counter of its statements.
func benchPool(b *testing.B, maxConns int32) (*pgxpool.Pool, *statementCounter) {
	b.Helper()
	pc, err := pgxpool.ParseConfig(pgtest.NewDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	counter := &statementCounter{}
	pc.ConnConfig.Tracer = counter
	pc.MaxConns = maxConns
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := migrate.Up(ctx, pool, discard()); err != nil {
		b.Fatal(err)
	}
	m := &dedup.Maintainer{Pool: pool, Retention: 7 * 24 * time.Hour, Ahead: 3, LockTimeout: time.Second,
		Now: time.Now, Logger: discard()}
	if _, err := m.RunOnce(ctx); err != nil {
		b.Fatal(err)
	}
	return pool, counter
}

// instantCharger takes every charge at once.
var instantCharger = chargerFunc(func(context.Context, billing.ChargeRequest) (billing.ChargeResult, error) {
	return billing.ChargeResult{ChargeID: "ch_bench"}, nil
})

// benchEvents returns n events for distinct orders starting at first.
func benchEvents(n int, first int64) []events.OrderConfirmed {
	evs := make([]events.OrderConfirmed, n)
	t := time.Now().UTC()
	for i := range evs {
		evs[i] = events.OrderConfirmed{EventID: events.IDAt(t), EventType: events.EventType, OccurredAt: t,
			OrderID: first + int64(i), CustomerID: 42, TotalAmount: 1999}
	}
	return evs
}

func benchService(b *testing.B, pool *pgxpool.Pool) *billing.Service {
	b.Helper()
	svc, err := billing.New(billing.Config{Store: postgres.NewStoreOn(pool), Charger: instantCharger, Group: group, Now: time.Now,
		Logger: discard(), DBTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// BenchmarkProcess bills one event at a time (the sequential mode): one
// op is one event.
func BenchmarkProcess(b *testing.B) {
	pool, counter := benchPool(b, 4)
	svc := benchService(b, pool)
	evs := benchEvents(b.N, 1)
	ctx := context.Background()
	counter.n.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if res, err := svc.Process(ctx, evs[i]); err != nil || res.Outcome != billing.Charged {
			b.Fatalf("event %d: %+v, %v", i, res, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "stmts/event")
}

// BenchmarkBatcher bills events from 64 concurrent callers, each sending
// its next event as soon as the last one is billed (as the pipeline's
// workers do), through a Batcher of the default shape: one op is one
// event.
func BenchmarkBatcher(b *testing.B) {
	const callers = 64
	pool, counter := benchPool(b, 32)
	svc := benchService(b, pool)
	var batches, billed atomic.Int64
	bt := billing.NewBatcher(svc, billing.BatcherConfig{MaxBatch: 32, MaxInFlight: 28, Linger: 2 * time.Millisecond,
		Callers: callers, Observe: func(n int) { batches.Add(1); billed.Add(int64(n)) }})
	defer bt.Close()
	billAll(b, bt, counter, callers)
	if n := batches.Load(); n > 0 {
		b.ReportMetric(float64(billed.Load())/float64(n), "events/batch")
	}
}

// BenchmarkBatcherPaced feeds the Batcher as the pipeline does under
// steady load: events arrive one by one, every 200 µs (5,000/s) or 1 ms
// (1,000/s), and each
// is billed by one of 256 workers. The arrival rate, not billing, sets
// ns/op here; what it measures is how full the batches get (events/batch)
// and what that costs per event (stmts/event, allocs/op).
func BenchmarkBatcherPaced(b *testing.B) {
	for _, every := range []time.Duration{200 * time.Microsecond, time.Millisecond} {
		b.Run(every.String(), func(b *testing.B) { benchPaced(b, every) })
	}
}

func benchPaced(b *testing.B, every time.Duration) {
	const workers = 256
	pool, counter := benchPool(b, 32)
	svc := benchService(b, pool)
	var batches, billed, singles atomic.Int64
	bt := billing.NewBatcher(svc, billing.BatcherConfig{MaxBatch: 32, MaxInFlight: 28, Linger: 2 * time.Millisecond,
		Callers: workers, Observe: func(n int) {
			batches.Add(1)
			billed.Add(int64(n))
			if n == 1 {
				singles.Add(1)
			}
		}})
	defer bt.Close()
	evs := benchEvents(b.N, 1)
	ctx := context.Background()
	work := make(chan events.OrderConfirmed)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ev := range work {
				if res, err := bt.Process(ctx, ev); err != nil || res.Outcome != billing.Charged {
					b.Errorf("order %d: %+v, %v", ev.OrderID, res, err)
				}
			}
		})
	}
	counter.n.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i, ev := range evs {
		if d := time.Until(start.Add(time.Duration(i) * every)); d > 0 {
			time.Sleep(d)
		}
		work <- ev
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "stmts/event")
	if n := batches.Load(); n > 0 {
		b.ReportMetric(float64(billed.Load())/float64(n), "events/batch")
		b.ReportMetric(float64(singles.Load())/float64(n), "singles/batch")
	}
}

// BenchmarkBatcherHTTP is BenchmarkBatcher with the charges sent over
// loopback HTTP to the provider simulator through the real payment
// client, so that each charge runs the client's whole call chain (where a
// fresh goroutine per charge grows its stack again): one op is one event.
func BenchmarkBatcherHTTP(b *testing.B) {
	const callers = 64
	pool, counter := benchPool(b, 32)
	sim := paysim.New(paysim.Config{Token: "secret-token", Seed: 1})
	srv := httptest.NewServer(sim)
	b.Cleanup(srv.Close)
	client, err := payment.New(payment.Config{BaseURL: srv.URL, Token: "secret-token", Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := billing.New(billing.Config{Store: postgres.NewStoreOn(pool), Charger: client.ForBilling(), Group: group, Now: time.Now,
		Logger: discard(), DBTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	bt := billing.NewBatcher(svc, billing.BatcherConfig{MaxBatch: 32, MaxInFlight: 28, Linger: 2 * time.Millisecond, Callers: callers})
	defer bt.Close()
	billAll(b, bt, counter, callers)
}

// billAll bills b.N fresh events through bt from callers goroutines at
// once, each event expected to be charged, timing only that, and reports
// the statements per event counted meanwhile.
func billAll(b *testing.B, bt *billing.Batcher, counter *statementCounter, callers int) {
	evs := benchEvents(b.N, 1)
	var next atomic.Int64
	ctx := context.Background()
	counter.n.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(evs)) {
					return
				}
				if res, err := bt.Process(ctx, evs[i]); err != nil || res.Outcome != billing.Charged {
					b.Errorf("event %d: %+v, %v", i, res, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "stmts/event")
}
