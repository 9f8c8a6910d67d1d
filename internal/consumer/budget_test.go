package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// acquire charges exactly cost to partition (see reserve).
func (b *budget) acquire(ctx context.Context, partition int, cost int64) error {
	_, err := b.reserve(ctx, partition, cost, cost)
	return err
}

// acquired reports whether acquire for partition returns within a short
// wait (true) or is still waiting (false, and the wait is abandoned).
func acquired(t *testing.T, b *budget, partition int, cost int64) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	return b.acquire(ctx, partition, cost) == nil
}

// TestBudgetSharesAndPool: each partition gets its reserved share even
// when another has taken the whole pool; beyond its share a partition
// takes from the pool while it has room; what is released is admitted
// again; releaseAll gives back everything.
func TestBudgetSharesAndPool(t *testing.T) {
	// 1,000 for 4 partitions: a pool of 500, a share of 125 each.
	b := newBudget(1000, 100, []int{0, 1, 2, 3})
	if b.share != 125 || b.free != 500 {
		t.Fatalf("share %d, pool %d; want 125 and 500", b.share, b.free)
	}
	for i := range 6 { // 125 of its share, then 475 of the pool
		if !acquired(t, b, 0, 100) {
			t.Fatalf("partition 0's record %d (of 100) refused with %d in use", i, b.inUse())
		}
	}
	if acquired(t, b, 0, 100) {
		t.Fatalf("partition 0 took 700 of a budget whose pool and share hold 625")
	}
	for p := 1; p <= 3; p++ {
		if !acquired(t, b, p, 100) {
			t.Fatalf("partition %d starved: its share refused while partition 0 holds the pool", p)
		}
	}
	if acquired(t, b, 1, 100) {
		t.Fatalf("partition 1 went past its share with the pool full")
	}
	b.release(0, 100)
	if !acquired(t, b, 1, 100) {
		t.Fatalf("partition 1 refused after partition 0 gave 100 back to the pool")
	}
	b.releaseAll(0)
	if got := b.inUse(); got != 400 {
		t.Fatalf("%d in use after partition 0 released all, want the 400 of partitions 1-3", got)
	}
	if got := b.poolSize(); got != 500 {
		t.Fatalf("the pool's free and borrowed parts add up to %d, want 500", got)
	}
}

// poolSize is the pool: what is free in it plus what partitions borrowed.
func (b *budget) poolSize() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.free
	for _, u := range b.used {
		n += b.borrowed(u)
	}
	return n
}

// TestBudgetWaitersInOrder: partitions waiting for the pool are admitted in
// the order they asked, and a waiter that gives up does not hold up those
// behind it.
func TestBudgetWaitersInOrder(t *testing.T) {
	b := newBudget(400, 100, []int{0, 1, 2, 3}) // pool 200, shares 50
	if !acquired(t, b, 0, 250) {                // its share and the whole pool
		t.Fatal("partition 0 refused within its share and the pool")
	}
	order := make(chan int, 3)
	var wg sync.WaitGroup
	giveUp, cancelGiveUp := context.WithCancel(context.Background())
	wait := func(p int, ctx context.Context) {
		wg.Go(func() {
			if b.acquire(ctx, p, 100) == nil {
				order <- p
			}
		})
		poll.Until(t, 5*time.Second, fmt.Sprintf("partition %d to wait", p), func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.waiters) > 0 && b.waiters[len(b.waiters)-1].partition == p
		})
	}
	// Each asks for 100: 50 from its share, 50 from the pool (50 free).
	wait(1, context.Background())
	wait(2, giveUp)
	wait(3, context.Background())
	b.release(0, 50) // room for one of them
	if got := <-order; got != 1 {
		t.Fatalf("partition %d admitted first, want 1 (the first to ask)", got)
	}
	cancelGiveUp() // 2 gives up; 3 is next, once there is room
	b.release(0, 100)
	wg.Wait()
	close(order)
	var rest []int
	for p := range order {
		rest = append(rest, p)
	}
	if len(rest) != 1 || rest[0] != 3 {
		t.Fatalf("admitted %v after partition 1, want [3] (2 gave up)", rest)
	}
}

// TestBudgetAdmitsAMaximalRecord: however many partitions share it, a
// budget that holds one maximal record admits one, even in a partition
// whose share is smaller.
func TestBudgetAdmitsAMaximalRecord(t *testing.T) {
	ids := make([]int, 160)
	for i := range ids {
		ids[i] = i
	}
	b := newBudget(1000, 1000, ids)
	if !acquired(t, b, 7, b.cost(kafka.Message{Value: make([]byte, 5000)})) {
		t.Fatal("a record larger than the fetch limit refused by an empty budget that holds a maximal one")
	}
	if got := b.inUse(); got != 1000 {
		t.Fatalf("the oversized record costs %d, want the maximal 1000", got)
	}
}

// TestBudgetNoPartitionStarves is the consumer under a budget far smaller
// than its partitions' traffic: 8 partitions, 60 records each, a budget
// of 16 records, Concurrency 100, and partition 0 one slow key (all its
// records one key; the first waits until the others are all committed).
// Fetching pauses (the budget is full with partition 0's queue), yet every
// other partition is committed to its end while partition 0 waits; no
// more records are in flight at once than the budget holds; every record
// is handled exactly once, and everything is committed in the end. It
// runs with shares worth a fetch (records up to 1 KiB: a share of 518
// bytes, a quarter of a maximal record 384), and with smaller ones
// (records up to 2 KiB: 518 against 640), which wait for the pool first
// and take room in their shares once it stalls (see worthAFetch); a
// share still holds one of these records, which cost 518 (a record
// larger than its share waits for the pool, stalled or not).
func TestBudgetNoPartitionStarves(t *testing.T) {
	for _, c := range []struct {
		name           string
		maxRecordBytes int
	}{{"shares worth a fetch", 1024}, {"small shares", 2048}} {
		t.Run(c.name, func(t *testing.T) { testNoPartitionStarves(t, c.maxRecordBytes) })
	}
}

func testNoPartitionStarves(t *testing.T, maxRecordBytes int) {
	const partitions, perPartition, budgetRecords = 8, 60, 16
	env := newKafkaEnv(t, partitions)
	w := env.writer()
	defer w.Close()
	var msgs []kafka.Message
	for p := range partitions {
		for i := range perPartition {
			key := fmt.Appendf(nil, "%d/k%02d", p, i%10)
			if p == 0 {
				key = []byte("0/k00") // the slow key
			}
			msgs = append(msgs, kafka.Message{Key: key, Value: []byte("v")})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	var (
		mu       sync.Mutex
		handled  = map[[2]int64]int{} // partition, offset: calls
		inFlight atomic.Int64         // records fetched and not done
		maxSeen  atomic.Int64
	)
	others := make(chan struct{})
	cfg := env.config(t)
	cfg.Concurrency = 100
	cfg.CommitInterval = 20 * time.Millisecond
	cfg.MaxRecordBytes, cfg.MaxInFlightBytes = maxRecordBytes, budgetRecords*(RecordOverhead+6)
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := maxSeen.Load(); n > m && !maxSeen.CompareAndSwap(m, n); m = maxSeen.Load() {
		}
		if msg.Partition == 0 && msg.Offset == 0 {
			select { // the slow key: until every other partition is committed
			case <-others:
			case <-ctx.Done():
				return ctx.Err()
			}
		} else {
			time.Sleep(2 * time.Millisecond) // a provider's latency: records overlap
		}
		mu.Lock()
		handled[[2]int64{int64(msg.Partition), msg.Offset}]++
		mu.Unlock()
		return nil
	})
	poll.Until(t, waitLong, "every partition but the slow one committed to its end", func() bool {
		for p, l := range env.lags(t) {
			if p != 0 && l.Committed != perPartition {
				return false
			}
		}
		return true
	})
	if l := env.lags(t)[0]; l.Committed > 0 {
		t.Fatalf("partition 0 committed %d past its unfinished first record", l.Committed)
	}
	close(others)
	poll.Until(t, waitLong, "everything committed", func() bool { return committedAtEnd(env.lags(t)) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// Handlers running at once are a lower bound of the records in flight.
	if m := maxSeen.Load(); m > budgetRecords {
		t.Errorf("%d handlers ran at once with a budget of %d records", m, budgetRecords)
	}
	mu.Lock()
	defer mu.Unlock()
	for p := range partitions {
		for o := range perPartition {
			if n := handled[[2]int64{int64(p), int64(o)}]; n != 1 {
				t.Errorf("partition %d offset %d handled %d times, want once", p, o, n)
			}
		}
	}
	t.Logf("at most %d handlers at once", maxSeen.Load())
}
