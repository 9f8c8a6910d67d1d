package consumer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// TestFetchSizeAndSlots: a fetch asks for the budget's share of each
// partition, between 16 KiB and a maximal record; a quarter of the
// budget's maximal records may be decoded at once, at least one.
func TestFetchSizeAndSlots(t *testing.T) {
	const mib = 1 << 20
	pod := int64(230 * mib / 32) // the default budget under the pod's GOMEMLIMIT
	maxCost := int64(mib + RecordOverhead)
	for _, c := range []struct {
		name              string
		total, maxCost    int64
		partitions        int
		wantBytes, wantSl int
	}{
		{"pod, 160 partitions", pod, maxCost, 160, int(pod / 160), 1},
		{"pod, 12 partitions", pod, maxCost, 12, int(pod / 12), 1},
		{"pod, one partition: at most a maximal record", pod, maxCost, 1, mib, 1},
		{"pod, 1,000 partitions: at least 16 KiB", pod, maxCost, 1000, 16 << 10, 1},
		{"no partitions yet", pod, maxCost, 0, mib, 1},
		{"a budget of 64 maximal records", 64 * maxCost, maxCost, 160, int(64 * maxCost / 160), 16},
		{"small records, a small budget", 66 << 10, 16<<10 + RecordOverhead, 16, 16 << 10, 1},
	} {
		if got := fetchSize(c.total, c.maxCost, c.partitions); got != c.wantBytes {
			t.Errorf("%s: fetchSize %d, want %d", c.name, got, c.wantBytes)
		}
		if got := fetchSlots(c.total, c.maxCost); got != c.wantSl {
			t.Errorf("%s: fetchSlots %d, want %d", c.name, got, c.wantSl)
		}
	}
	ids := make([]int, 160)
	for i := range ids {
		ids[i] = i
	}
	if b := newBudget(pod, maxCost, ids); b.fetchBytes != int(pod/160) || cap(b.slots) != 1 || len(b.slots) != 1 || b.shareFirst {
		t.Errorf("newBudget: fetchBytes %d, %d of %d slots free, share first %v; want %d, 1 of 1, false (a share of %d)",
			b.fetchBytes, len(b.slots), cap(b.slots), b.shareFirst, pod/160, b.share)
	}
	// 12 partitions under the pod's defaults: shares of 300 KB, worth a
	// fetch; 8 MiB (no memory limit) on the bench's 6 partitions too.
	if b := newBudget(pod, maxCost, ids[:12]); !b.shareFirst {
		t.Errorf("a share of %d on 12 partitions: not first, want first (at least %d)", b.share, worthAFetch(maxCost))
	}
	if b := newBudget(8*mib, maxCost, ids[:6]); !b.shareFirst {
		t.Errorf("a share of %d on 6 partitions: not first, want first", b.share)
	}
}

// TestBudgetReserve: reserve charges the most asked for when the share or
// the pool has room at once. Beyond that a partition waits for its turn at
// the pool while the pool grants, even when its own releases leave room in
// its share: a refetch for a share's worth decodes a producer's whole
// record batch again. Once the pool has granted nothing for b.stall
// (records that do not finish hold it), a waiter takes what is left of
// its share, least or more, at once or after its own releases; the
// pool's next loan ends the stall.
func TestBudgetReserve(t *testing.T) {
	ctx := context.Background()
	// fill has partition 0 take 200 at once, then the rest of its share
	// and the whole pool.
	fill := func(b *budget) {
		t.Helper()
		if got, err := b.reserve(ctx, 0, 10, 200); got != 200 || err != nil {
			t.Fatalf("empty budget: reserved %d (%v), want the most, 200", got, err)
		}
		if !b.tryAcquire(0, 425) || b.tryAcquire(0, 1) {
			t.Fatalf("partition 0 could not take exactly its share and the pool (in use %d)", b.inUse())
		}
	}
	waiting := func(b *budget, n int) {
		poll.Until(t, 5*time.Second, fmt.Sprintf("%d waiting for the pool", n), func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.waiters) == n
		})
	}
	reserve := func(b *budget, partition int, least, most int64) <-chan int64 {
		got := make(chan int64, 1)
		go func() {
			n, _ := b.reserve(ctx, partition, least, most)
			got <- n
		}()
		return got
	}

	b := newBudget(1000, 200, []int{0, 1, 2, 3}) // a share of 125 each, a pool of 500
	b.stall = time.Hour                          // a pool that never stalls
	b.shareFirst = false                         // as if the shares were small (see worthAFetch)
	fill(b)
	got2 := reserve(b, 2, 200, 200)
	waiting(b, 1)
	if b.tryAcquire(1, 126) {
		t.Fatal("tryAcquire took from the pool past a waiter")
	}
	// Partition 3 holds 100 of its share and asks for 50 to 200: its own
	// release empties its share, yet it waits for its turn, behind 2.
	if !b.tryAcquire(3, 100) {
		t.Fatal("partition 3 refused its share")
	}
	got3 := reserve(b, 3, 50, 200)
	waiting(b, 2)
	b.release(3, 100)
	select {
	case n := <-got3:
		t.Fatalf("partition 3 got %d of its share while the pool was not stalled, want its turn at the pool", n)
	case <-time.After(100 * time.Millisecond):
	}
	b.release(0, 425)
	if n2, n3 := granted(t, got2), granted(t, got3); n2 != 200 || n3 != 200 {
		t.Fatalf("partitions 2 and 3 got %d and %d from the pool, want 200 each, in turn", n2, n3)
	}

	// A pool that stalls: partition 0 keeps it all.
	b = newBudget(1000, 200, []int{0, 1, 2, 3})
	b.stall, b.shareFirst = 20*time.Millisecond, false
	fill(b)
	if !b.tryAcquire(1, 100) || !b.tryAcquire(3, 100) {
		t.Fatal("partitions 1 and 3 refused their shares")
	}
	// Partition 1 asks for 20 to 200: the 25 left of its share once the
	// pool stalled.
	if n := granted(t, reserve(b, 1, 20, 200)); n != 25 {
		t.Fatalf("partition 1 got %d with the pool stalled, want the 25 left of its share", n)
	}
	// Partition 3 asks for 50 to 200: it waits until its own releases
	// leave 50 of its share, and gets what is left.
	got3 = reserve(b, 3, 50, 200)
	waiting(b, 1)
	b.release(3, 20) // 45 left: not yet
	b.release(3, 10)
	if n := granted(t, got3); n != 55 {
		t.Fatalf("partition 3 got %d after its own releases with the pool stalled, want the 55 left of its share", n)
	}
	b.release(0, 425)
	if !b.tryAcquire(2, 200) {
		t.Fatal("partition 2 refused with the pool free")
	}
	b.mu.Lock()
	stalled := b.stalled
	b.mu.Unlock()
	if stalled {
		t.Fatal("the pool still counts as stalled after it lent again")
	}

	// Shares worth a fetch (125, a maximal record 200): a waiter takes
	// room in its own share as soon as its releases leave its least.
	b = newBudget(1000, 200, []int{0, 1, 2, 3})
	b.stall = time.Hour
	fill(b)
	if !b.tryAcquire(3, 100) {
		t.Fatal("partition 3 refused its share")
	}
	got3 = reserve(b, 3, 50, 200)
	waiting(b, 1)
	b.release(3, 100)
	if n := granted(t, got3); n != 125 {
		t.Fatalf("partition 3 got %d with shares worth a fetch, want its whole share, 125", n)
	}
}

// granted is what a reserve under way returned, within 5 s.
func granted(t *testing.T, got <-chan int64) int64 {
	t.Helper()
	select {
	case n := <-got:
		return n
	case <-time.After(5 * time.Second):
		t.Fatal("reserve still waiting after 5 s")
		return 0
	}
}

// TestFetchLargeCompressedBatches: records produced in compressed batches
// (snappy, up to 64 KiB) far larger than each partition's share of the
// budget, on 16 partitions with one slot, and one record per partition
// larger than its share: the fetchers drop what does not fit and fetch it
// again, and every record is handled exactly once, in offset order, and
// committed.
func TestFetchLargeCompressedBatches(t *testing.T) {
	const partitions, perPartition = 16, 400
	env := newKafkaEnv(t, partitions)
	w := env.writer()
	w.Compression, w.BatchBytes, w.BatchSize = kafka.Snappy, 64<<10, partitions*perPartition
	defer w.Close()
	var msgs []kafka.Message
	for p := range partitions {
		for i := range perPartition {
			v := fmt.Appendf(nil, `{"order":%d,"amount":%d,"note":"%0200d"}`, p*perPartition+i, i, i)
			if i == perPartition/2 {
				v = make([]byte, 8<<10) // larger than any partition's share
			}
			msgs = append(msgs, kafka.Message{Key: partitionKey(p, i), Value: v})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	cfg := env.config(t)
	cfg.Concurrency, cfg.CommitInterval = 8, 20*time.Millisecond
	cfg.MaxRecordBytes = 16 << 10
	cfg.MaxInFlightBytes = 4 * cfg.maxCost() // one slot; a share of about 2 KiB
	var (
		mu      sync.Mutex
		last    = map[int]int64{}
		handled int
		errs    []string
	)
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := last[msg.Partition]; ok && msg.Offset != prev+1 || !ok && msg.Offset != 0 {
			errs = append(errs, fmt.Sprintf("partition %d: offset %d after %d", msg.Partition, msg.Offset, prev))
		}
		last[msg.Partition] = msg.Offset
		handled++
		return nil
	})
	poll.Until(t, waitLong, "everything committed", func() bool { return committedAtEnd(env.lags(t)) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 || handled != partitions*perPartition {
		t.Fatalf("handled %d records, want %d once each in offset order; %d out of order: %v", handled, partitions*perPartition, len(errs), errs[:min(len(errs), 5)])
	}
}
