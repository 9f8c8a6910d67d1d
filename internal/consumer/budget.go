package consumer

import (
	"context"
	"slices"
	"sync"
	"time"

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
// asked (FIFO). A fetch is never refused a record within its partition's
// share, and a stopped partition waits for room in its share or its turn
// at the pool, so none starves however busy the others are; a busy
// partition can use the pool while others are quiet. A partition whose
// fetch waits for the budget simply does not fetch: Kafka keeps the
// records. When shares are small (see worthAFetch) a stopped partition
// waits for its turn at the pool only, while the pool grants: such a
// share is a small part of a producer's record batch, and each refetch
// decodes the whole batch again. Once the pool stalls (see stalled) it
// takes room in its share again, so none starves however stuck the
// others are either.
//
// A record costs at most maxCost, and the pool holds at least maxCost, so
// every record can eventually be admitted. budget is safe for concurrent
// use.
//
// The budget also bounds what fetching holds outside it (see fetcher):
// each fetch asks the broker for at most fetchBytes, and only as many
// partitions as there are slots decode a fetched response at once.
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

	// fetchBytes is what one fetch of a partition asks the broker for
	// (see fetchSize).
	fetchBytes int
	// slots holds a token for each partition allowed to decode a fetched
	// response at once (see fetchSlots); Go's channels wake waiting
	// receivers in the order they came, so slots are granted FIFO.
	slots chan struct{}

	// stalled is set once the pool has granted no waiter for stall since
	// partitions began to wait for it or since its last grant (records
	// that do not finish hold it: a failing order's, until it is parked),
	// and cleared once it lends again. When shares are small, only while
	// it is set does a waiter take what is left of its own share (see
	// admitsUpTo), so records that do not finish hold up the other
	// partitions for stall, not until they finish; a pool that grants at
	// least once per stall is waited for in turn. A record larger than its
	// share waits for the pool, stalled or not. stallTimer sets it (see
	// armStall).
	stalled    bool
	shareFirst bool // see worthAFetch
	stall      time.Duration
	stallTimer *time.Timer
	stallSince time.Time // when stallTimer was last armed
}

// poolStall is how long the pool may grant no waiter before waiters take
// room in their own shares instead (see budget.stalled). In a drain of
// 160 partitions with 1 MiB record batches the pool grants one every
// 150-200 ms here; a pool that grants less often than this has waiters
// take from their shares until it lends again.
const poolStall = 500 * time.Millisecond

// budgetWaiter is a partition's fetch waiting for room (see reserve);
// granted is closed once got, least or most, is charged.
type budgetWaiter struct {
	partition   int
	least, most int64
	got         int64
	granted     chan struct{}
}

// newBudget splits total among partitions; maxCost is what the largest
// record costs (callers ensure total >= maxCost).
func newBudget(total, maxCost int64, partitions []int) *budget {
	n := int64(max(len(partitions), 1))
	pool := max(total/2, min(maxCost, total))
	b := &budget{share: (total - pool) / n, maxCost: maxCost, used: make(map[int]int64, n), waiting: make(map[int]*budgetWaiter, n),
		fetchBytes: fetchSize(total, maxCost, len(partitions)), slots: make(chan struct{}, fetchSlots(total, maxCost)), stall: poolStall}
	b.free = total - b.share*n
	b.shareFirst = b.share >= worthAFetch(maxCost)
	for range cap(b.slots) {
		b.slots <- struct{}{}
	}
	return b
}

// minFetchBytes is the least a fetch asks for: below it, a partition's
// fetches would cost more round trips than the memory they save.
const minFetchBytes = 16 << 10

// fetchSize is what one fetch of a partition asks the broker for: the
// budget's share of each of the partitions, at least minFetchBytes, at
// most a maximal record (maxCost less RecordOverhead). A fetch's response
// waits in the partition's socket until it is decoded, so the partitions'
// fetches together ask for about the budget, not a maximal record each.
// Kafka still returns a whole record batch larger than that, alone (how a
// record larger than the share is fetched).
func fetchSize(total, maxCost int64, partitions int) int {
	largest := maxCost - RecordOverhead
	return int(min(largest, max(total/int64(max(partitions, 1)), minFetchBytes)))
}

// refill is the least credit from its own share that a fetcher stopped by
// the budget takes (when shares are worth a fetch, or the pool stalled)
// before it fetches again, unless the record that did not fit costs more:
// half the partition's share, at most a fetch. Waiting for one record's
// room instead would refetch, and decode again, a whole response per
// record released while a backlog drains; half the share keeps the other
// half of the partition's records running meanwhile.
func (b *budget) refill() int64 {
	return min(b.share/2, int64(b.fetchBytes))
}

// fetchSlots is how many partitions may decode a fetched response at
// once: a quarter of the budget's maximal records, at least one. Decoding
// a compressed record batch holds it whole, decompressed (kafka-go grows
// a buffer to four times the compressed batch, or twice the decompressed
// one): up to about 4 × maxCost a slot, so the slots hold at most about
// the budget again, whatever the partition count or the producers'
// batching.
func fetchSlots(total, maxCost int64) int {
	return int(max(1, total/(4*maxCost)))
}

// worthAFetch is the least share in which a stopped partition takes room
// (half its share, see refill) without waiting for its turn at the pool
// or for the pool to stall: a quarter of a maximal record. A smaller
// share is a small part of a producer's large record batch, and a fetch
// for it decodes the whole batch again (at 160 partitions under the pod's
// defaults a share is 23 KiB: each 1 MiB batch was decoded 25 times); a
// larger one is worth its fetch and keeps a few partitions' records
// flowing while they wait (up to 14 partitions under the pod's defaults,
// and make bench's drain of 6 under 8 MiB).
func worthAFetch(maxCost int64) int64 { return maxCost / 4 }

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
	if e > 0 {
		b.stalled = false
	}
	return true
}

// reserve charges partition at least least and at most most (least <=
// most <= maxCost), waiting while most does not fit in the share or the
// pool, or partitions that asked earlier wait for the pool. It returns
// what it charged: most from the pool or the share when they have room,
// else, while the pool is stalled or shares are worth a fetch (see
// worthAFetch), what is left of the share (least or more), at once or
// once the partition's own releases leave that much (so that another's
// stuck records hold it up for the stall only). It returns ctx's error
// if ctx ends first, having charged nothing.
func (b *budget) reserve(ctx context.Context, partition int, least, most int64) (int64, error) {
	b.mu.Lock()
	if got := b.admitsUpTo(partition, least, most); got > 0 {
		b.mu.Unlock()
		return got, nil
	}
	w := &budgetWaiter{partition: partition, least: least, most: most, granted: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.waiting[partition] = w
	if len(b.waiters) == 1 {
		b.armStall()
	}
	b.mu.Unlock()
	select {
	case <-w.granted:
		return w.got, nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiting[partition] == w {
		b.remove(w)
		b.grantPool() // w may have held up those behind it
		return 0, ctx.Err()
	}
	// Granted just as ctx ended: give it back.
	b.releaseLocked(partition, w.got)
	return 0, ctx.Err()
}

// admitsUpTo charges partition most if that needs no wait, else, while
// the pool is stalled or shares are worth a fetch, what is left of its
// share, up to most, if that is least or more, and returns what it
// charged (0: nothing); b.mu is held.
func (b *budget) admitsUpTo(partition int, least, most int64) int64 {
	if b.admits(partition, most) {
		return most
	}
	// As much of the share as is left: a fetcher refetches once per
	// credit, not once per record.
	if room := min(b.share-b.used[partition], most); (b.shareFirst || b.stalled) && room >= least && b.charge(partition, room) {
		return room
	}
	return 0
}

// tryAcquire charges cost to partition if that takes no waiting: within
// its share, or from the pool while no partition waits for it. It reports
// whether it charged.
func (b *budget) tryAcquire(partition int, cost int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.admits(partition, cost)
}

// tryShare charges cost to partition if it fits in the partition's share
// (see fetcher.admit), and reports whether it charged.
func (b *budget) tryShare(partition int, cost int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.extra(partition, cost) == 0 && b.charge(partition, cost)
}

// admits charges cost to partition if it fits without overtaking a
// partition waiting for the pool; b.mu is held.
func (b *budget) admits(partition int, cost int64) bool {
	return (len(b.waiters) == 0 || b.extra(partition, cost) == 0) && b.charge(partition, cost)
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
// partition's own waiter if its share now holds what it asked for (or,
// shares worth a fetch or the pool stalled, its least; only its own
// releases can bring that about), then waiters for the pool in order, so
// that a release costs O(1), not a scan of every partition; b.mu is held.
func (b *budget) releaseLocked(partition int, cost int64) {
	u := b.used[partition]
	cost = min(cost, u)
	b.free += b.borrowed(u) - b.borrowed(u-cost)
	b.used[partition] = u - cost
	if w := b.waiting[partition]; w != nil {
		b.grantOwn(w)
	}
	b.grantPool()
}

// grantOwn grants w what admitsUpTo admits for it, if anything, out of
// the pool's order (from its share, or when most fits without
// overtaking); b.mu is held.
func (b *budget) grantOwn(w *budgetWaiter) {
	if w.got = b.admitsUpTo(w.partition, w.least, w.most); w.got > 0 {
		b.remove(w)
		close(w.granted)
	}
}

// grantPool admits the waiters for the pool in the order they asked, while
// the first fits; a grant starts the wait for a stall again; b.mu is held.
func (b *budget) grantPool() {
	granted := false
	for len(b.waiters) > 0 && b.charge(b.waiters[0].partition, b.waiters[0].most) {
		w := b.waiters[0]
		w.got = w.most
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
		delete(b.waiting, w.partition)
		close(w.granted)
		granted = true
	}
	if granted && len(b.waiters) > 0 {
		b.armStall()
	}
}

// armStall (re)starts the wait after which the pool counts as stalled:
// when partitions begin to wait for it, and at each of its grants; b.mu
// is held.
func (b *budget) armStall() {
	b.stallSince = time.Now()
	if b.stallTimer == nil {
		b.stallTimer = time.AfterFunc(b.stall, b.onStall)
		return
	}
	b.stallTimer.Reset(b.stall)
}

// onStall runs stall after the pool's last grant or first waiter: if
// partitions still wait and it was not armed again since (a run that
// raced a grant finds stallSince recent: the timer runs again), the pool
// is stalled, and each waiter takes what its share has left (see
// admitsUpTo).
func (b *budget) onStall() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiters) == 0 || b.stalled || time.Since(b.stallSince) < b.stall {
		return
	}
	b.stalled = true
	for _, w := range slices.Clone(b.waiters) {
		b.grantOwn(w)
	}
	b.grantPool() // the new first waiter may fit the pool
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
