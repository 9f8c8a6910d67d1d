package consumer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// TestABurstLeavesNoArraysBehind: once a burst is done, the partitions
// keep nothing of it (fifo.go). 16 partitions each take 3,000 records at
// once while the workers are held, as a large producer batch on each
// partition does (the budget holds them all); once everything is
// committed, the live heap is back within 3 MiB of where it was before the
// consumer started. Before the queues gave their arrays back, each
// partition kept its burst's ready queue, offsets entries and key map:
// about 16 MiB here, 33 MB at 160 partitions with 1 MiB batches in the
// bench.
func TestABurstLeavesNoArraysBehind(t *testing.T) {
	const partitions, perPartition = 16, 3000
	env := newKafkaEnv(t, partitions)
	w := env.writer()
	defer w.Close()
	msgs := make([]kafka.Message, 0, partitions*perPartition)
	for p := range partitions {
		for i := range perPartition { // a key each: they all wait in ready
			msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "%d/%d", p, i), Value: []byte("v")})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	msgs = nil
	cfg := env.config(t)
	cfg.Concurrency = partitions
	cfg.MaxInFlightBytes = 64 << 20
	release := make(chan struct{})
	before := liveHeap()
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// Time for the burst to be fetched into the queues behind the held
	// workers; a slower fetch makes a smaller burst, never a failure.
	time.Sleep(3 * time.Second)
	close(release)
	poll.Until(t, waitLong, "every record committed", func() bool { return committedAtEnd(env.lags(t)) })
	after := liveHeap()
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	t.Logf("the live heap grew by %.1f MiB", float64(after-before)/(1<<20))
	if grew := after - before; grew > 3<<20 {
		t.Fatalf("the live heap grew by %.1f MiB over a drained burst of %d records on %d partitions; want at most 3 MiB",
			float64(grew)/(1<<20), partitions*perPartition, partitions)
	}
}

// liveHeap is the heap's live bytes after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestFifoMatchesASliceAndFollowsItsItems: random pushes, inserts and pops
// leave a fifo with a plain slice's items, and after every pop its array
// is at most queueKeep or four times what it holds.
func TestFifoMatchesASliceAndFollowsItsItems(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q fifo[int]
	var want []int
	for step := range 50_000 {
		switch op := rng.IntN(10); {
		case op < 4 || len(want) == 0: // bursts of pushes, to grow the array
			for range rng.IntN(50) + 1 {
				q.Push(step)
				want = append(want, step)
			}
		case op < 5:
			i := rng.IntN(len(want) + 1)
			q.Insert(i, -step)
			want = append(want[:i], append([]int{-step}, want[i:]...)...)
		default:
			n := rng.IntN(len(want) + 1)
			q.Pop(n)
			want = want[n:]
			if c := cap(q.buf); c > queueKeep && c > 4*q.Len() {
				t.Fatalf("step %d: array of %d for %d items", step, c, q.Len())
			}
		}
		if !slices.Equal(q.Items(), want) {
			t.Fatalf("step %d: items %v, want %v", step, q.Items(), want)
		}
	}
}
