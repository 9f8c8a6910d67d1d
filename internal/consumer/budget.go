package consumer

import (
	"context"
	"sync"

	"github.com/segmentio/kafka-go"
)

// RecordOverhead is what a record costs in flight beyond its key, value
// and headers: its kafka.Message (copied into the partition's queues), its
// entry in the partition's offsets, its completion, rounded up. The budget
// charges every record its bytes plus this, so that a topic of tiny
// records is bounded by their count as well as by their bytes.
const RecordOverhead = 512

// entryCost is the part of RecordOverhead a record keeps holding after it
// is done, while an unfinished record before it keeps it from being
// committable: its entry in the partition's offsets (pendingMsg, 64 bytes,
// rounded up). A waiting record (its order failing at the provider until
// it is parked) thus holds little of the budget for what finished behind it.
const entryCost = 64

// budget bounds what a consumer holds in flight across all the partitions
// of a generation: the records fetched and not yet done, and the offsets
// entries of those done but not yet committable, in bytes (see cost). It
// replaces a window per partition, which let memory grow with the
// partition count.
//
// Fairness: half the budget (less, when a maximal record needs more of the
// pool) is split into a share reserved for each partition; the rest is a
// pool that partitions beyond their share take from in the order they
// asked (FIFO). A partition within its share never waits, so none starves
// however busy the others are; a busy partition can use the pool while
// others are quiet. A partition whose fetch waits for the budget simply
// does not fetch: Kafka keeps the records.
//
// A record costs at most maxCost, and the pool holds at least maxCost, so
// every record can eventually be admitted. budget is safe for concurrent
// use.
type budget struct {
	mu      sync.Mutex
	share   int64 // reserved for each partition
	free    int64 // of the pool
	maxCost int64
	used    map[int]int64 // per partition: its share and what it borrowed
	// waiters wait for the pool, in the order they asked; waiting is the
	// same by partition (a partition's one fetch waits at most once).
	waiters []*budgetWaiter
	waiting map[int]*budgetWaiter
}

// budgetWaiter is a partition's fetch waiting for room; granted is closed
// once its cost is charged.
type budgetWaiter struct {
	partition int
	cost      int64
	granted   chan struct{}
}

// newBudget splits total among partitions; maxCost is what the largest
// record costs (callers ensure total >= maxCost).
func newBudget(total, maxCost int64, partitions []int) *budget {
	n := int64(max(len(partitions), 1))
	pool := max(total/2, min(maxCost, total))
	b := &budget{share: (total - pool) / n, maxCost: maxCost, used: make(map[int]int64, n), waiting: make(map[int]*budgetWaiter, n)}
	b.free = total - b.share*n
	return b
}

// cost is what msg costs in flight: its bytes plus RecordOverhead, capped
// at maxCost (a record larger than the fetch limit, which Kafka still
// returns on its own, counts as a maximal one).
func (b *budget) cost(msg kafka.Message) int64 {
	n := int64(len(msg.Key) + len(msg.Value) + RecordOverhead)
	for _, h := range msg.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return min(n, b.maxCost)
}

// borrowed is what a partition using u takes from the pool.
func (b *budget) borrowed(u int64) int64 { return max(0, u-b.share) }

// extra is what charging cost to partition would take from the pool.
func (b *budget) extra(partition int, cost int64) int64 {
	u := b.used[partition]
	return b.borrowed(u+cost) - b.borrowed(u)
}

// charge takes cost for partition if it fits; b.mu is held.
func (b *budget) charge(partition int, cost int64) bool {
	e := b.extra(partition, cost)
	if e > b.free {
		return false
	}
	b.used[partition] += cost
	b.free -= e
	return true
}

// acquire charges cost to partition, waiting while it does not fit or
// while partitions that asked earlier wait for the pool. It returns ctx's
// error if ctx ends first, having charged nothing.
func (b *budget) acquire(ctx context.Context, partition int, cost int64) error {
	b.mu.Lock()
	if (len(b.waiters) == 0 || b.extra(partition, cost) == 0) && b.charge(partition, cost) {
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{partition: partition, cost: cost, granted: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.waiting[partition] = w
	b.mu.Unlock()
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiting[partition] == w {
		b.remove(w)
		b.grantPool() // w may have held up those behind it
		return ctx.Err()
	}
	// Granted just as ctx ended: give it back.
	b.releaseLocked(partition, cost)
	return ctx.Err()
}

// remove takes w out of the waiters; b.mu is held.
func (b *budget) remove(w *budgetWaiter) {
	delete(b.waiting, w.partition)
	for i, o := range b.waiters {
		if o == w {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			clear(b.waiters[len(b.waiters) : len(b.waiters)+1])
			return
		}
	}
}

// release gives back cost charged to partition.
func (b *budget) release(partition int, cost int64) {
	if cost <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.releaseLocked(partition, cost)
}

// releaseAll gives back everything partition holds (it stopped).
func (b *budget) releaseAll(partition int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.releaseLocked(partition, b.used[partition])
}

// releaseLocked gives back cost and admits what now fits: the releasing
// partition's own waiter if it is back within its share (only its own
// releases can bring it there), then waiters for the pool in order, so
// that a release costs O(1), not a scan of every partition; b.mu is held.
func (b *budget) releaseLocked(partition int, cost int64) {
	u := b.used[partition]
	cost = min(cost, u)
	b.free += b.borrowed(u) - b.borrowed(u-cost)
	b.used[partition] = u - cost
	if w := b.waiting[partition]; w != nil && b.extra(partition, w.cost) == 0 && b.charge(partition, w.cost) {
		b.remove(w)
		close(w.granted)
	}
	b.grantPool()
}

// grantPool admits the waiters for the pool in the order they asked, while
// the first fits; b.mu is held.
func (b *budget) grantPool() {
	for len(b.waiters) > 0 && b.charge(b.waiters[0].partition, b.waiters[0].cost) {
		w := b.waiters[0]
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
		delete(b.waiting, w.partition)
		close(w.granted)
	}
}

// inUse is what the partitions hold in total (for tests).
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, u := range b.used {
		n += u
	}
	return n
}
