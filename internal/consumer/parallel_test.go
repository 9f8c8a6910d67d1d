package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
	"github.com/segmentio/kafka-go"
)

// TestKeyOrderedParallelism: records of one key run one at a time in
// offset order; records of different keys run concurrently, within and
// across partitions, never more than Concurrency at once; commits still
// reach the end of every partition.
func TestKeyOrderedParallelism(t *testing.T) {
	env := newKafkaEnv(t, 3)
	const perPartition, keysPerPartition, concurrency = 40, 5, 8
	w := env.writer()
	defer w.Close()
	var msgs []kafka.Message
	for i := range perPartition {
		for p := range 3 {
			msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "%d/k%d", p, i%keysPerPartition), Value: []byte("v")})
		}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}

	var (
		mu        sync.Mutex
		active    = map[string]bool{}
		lastOff   = map[string]int64{}
		running   atomic.Int32
		maxRun    atomic.Int32
		total     atomic.Int32
		violation atomic.Value
	)
	cfg := env.config(t)
	cfg.Concurrency = concurrency
	cfg.CommitInterval = 50 * time.Millisecond
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		key := string(msg.Key)
		mu.Lock()
		if active[key] {
			violation.Store("two records of key " + key + " ran at once")
		}
		if last, ok := lastOff[key]; ok && msg.Offset <= last {
			violation.Store(fmt.Sprintf("key %s: offset %d after %d", key, msg.Offset, last))
		}
		active[key], lastOff[key] = true, msg.Offset
		mu.Unlock()
		n := running.Add(1)
		for m := maxRun.Load(); n > m && !maxRun.CompareAndSwap(m, n); m = maxRun.Load() {
		}
		time.Sleep(10 * time.Millisecond)
		running.Add(-1)
		mu.Lock()
		active[key] = false
		mu.Unlock()
		total.Add(1)
		return nil
	})
	poll.Until(t, waitLong, "every record handled and committed", func() bool {
		if total.Load() < 3*perPartition {
			return false
		}
		for _, l := range env.lags(t) {
			if l.Committed != perPartition {
				return false
			}
		}
		return true
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
	if m := maxRun.Load(); m <= 3 || m > concurrency {
		t.Fatalf("at most %d handlers ran at once; want more than one per partition and at most %d", m, concurrency)
	}
	t.Logf("up to %d handlers at once", maxRun.Load())
}

// TestBudgetBoundsFetching: with every handler blocked, a partition
// starts no more records than MaxInFlightBytes holds (4 here), however
// much Concurrency allows, and commits nothing past an unfinished record.
func TestBudgetBoundsFetching(t *testing.T) {
	env := newKafkaEnv(t, 1)
	w := env.writer()
	defer w.Close()
	var msgs []kafka.Message
	for i := range 50 {
		msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "0/k%02d", i), Value: []byte("v")})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var started atomic.Int32
	cfg := env.config(t)
	cfg.Concurrency = 100
	// Each record costs 5+1 bytes plus RecordOverhead: 4 fit, 5 do not.
	cfg.MaxRecordBytes, cfg.MaxInFlightBytes = 1024, 4*(RecordOverhead+6)
	cfg.CommitInterval = 20 * time.Millisecond
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		started.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	poll.Until(t, waitLong, "the budget to fill", func() bool { return started.Load() >= 4 })
	time.Sleep(300 * time.Millisecond) // give a wrong implementation the chance to start more
	if n := started.Load(); n != 4 {
		t.Fatalf("%d records started with a budget of 4", n)
	}
	if l := env.lags(t)[0]; l.Committed > 0 {
		t.Fatalf("committed %d while every record is unfinished", l.Committed)
	}
	close(release)
	poll.Until(t, waitLong, "everything committed", func() bool { return env.lags(t)[0].Committed == 50 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}
