package consumer

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// TestBudgetStallGrantsTheNextWaiter: when the pool stalls and its first
// waiter takes room in its own share instead, the next waiter, whose
// record is larger than its share, comes first and fits the pool: it is
// granted at once, not at some later release.
func TestBudgetStallGrantsTheNextWaiter(t *testing.T) {
	ctx := context.Background()
	b := newBudget(1000, 300, []int{0, 1, 2, 3}) // a share of 125 each, a pool of 500
	b.stall, b.shareFirst = time.Hour, false     // stalled by hand below
	if !b.tryAcquire(0, 425) || !b.tryAcquire(1, 50) {
		t.Fatal("partitions 0 and 1 refused their share and 300 of the pool")
	}
	waitFor := func(partition int, least int64) <-chan int64 {
		got := make(chan int64, 1)
		go func() {
			n, _ := b.reserve(ctx, partition, least, 300)
			got <- n
		}()
		poll.Until(t, 5*time.Second, "partition waiting", func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.waiting[partition] != nil
		})
		return got
	}
	got1 := waitFor(1, 62)  // 300 from the pool takes 225: 200 free
	got2 := waitFor(2, 200) // larger than its share; 300 takes 175 of the pool
	b.mu.Lock()
	b.stall = 0 // as if the timer ran an hour on
	b.mu.Unlock()
	b.onStall()
	if n := granted(t, got1); n != 75 {
		t.Fatalf("partition 1 got %d once the pool stalled, want the 75 left of its share", n)
	}
	select {
	case n := <-got2:
		if n != 300 {
			t.Fatalf("partition 2 got %d, want 300 from the pool", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("partition 2 comes first and fits the pool, yet still waits")
	}
}

// TestBudgetRandomWithStalls runs random reserves (cancelled or not),
// acquisitions and releases on budgets of random size and stall, checking
// the accounting after every step, and that waiters left alone are, in
// the end, either granted or stalled with no room to grant them: nothing
// fitting waits for a release that may never come.
func TestBudgetRandomWithStalls(t *testing.T) {
	for seed := range uint64(40) {
		runBudgetModel(t, seed)
	}
}

// budgetModel is one random run of TestBudgetRandomWithStalls.
type budgetModel struct {
	t           *testing.T
	seed        uint64
	b           *budget
	pool, total int64
	mu          sync.Mutex
	held        []int64 // per partition, what it was charged and holds
	cancels     []context.CancelFunc
	done        []chan struct{} // closed when the partition's reserve returned
	wg          sync.WaitGroup
}

func runBudgetModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	n := 2 + rng.IntN(6)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	maxCost := int64(50 + rng.IntN(200))
	total := maxCost + int64(rng.IntN(2000))
	m := &budgetModel{t: t, seed: seed, b: newBudget(total, maxCost, ids), total: total,
		held: make([]int64, n), cancels: make([]context.CancelFunc, n), done: make([]chan struct{}, n)}
	m.b.stall = time.Duration(2+rng.IntN(5)) * time.Millisecond
	m.b.shareFirst = seed%2 == 0 // both modes, whatever the sizes
	m.pool = m.b.free
	for step := range 400 {
		p := rng.IntN(n)
		switch op := rng.IntN(10); {
		case op < 3 && !m.busy(p):
			least := 1 + rng.Int64N(maxCost)
			most := least + rng.Int64N(maxCost-least+1)
			if rng.IntN(2) == 0 {
				most = maxCost
			}
			m.reserve(p, least, most)
		case op >= 3 && op < 5:
			if c := 1 + rng.Int64N(maxCost); m.b.tryAcquire(p, c) {
				m.hold(p, c)
			}
		case op >= 5 && op < 8:
			m.mu.Lock()
			c := rng.Int64N(m.held[p] + 1)
			m.held[p] -= c
			m.mu.Unlock()
			m.b.release(p, c)
		case op == 8 && m.busy(p):
			m.cancels[p]()
		case op == 9 && !m.busy(p):
			m.mu.Lock()
			m.held[p] = 0
			m.mu.Unlock()
			m.b.releaseAll(p)
		}
		m.check(false)
		if rng.IntN(8) == 0 {
			time.Sleep(time.Duration(rng.IntN(3)) * m.b.stall)
		}
		if step%50 == 49 {
			poll.Until(t, 10*time.Second, "waiters granted, or stalled with no room", func() bool { return m.check(true) })
		}
	}
	for p := range n {
		if m.cancels[p] != nil {
			m.cancels[p]()
		}
	}
	m.wg.Wait()
	for p := range n {
		m.b.release(p, m.held[p])
	}
	if got := m.b.inUse(); got != 0 || !m.check(false) {
		t.Fatalf("seed %d: %d in use once everything was released", seed, got)
	}
}

func (m *budgetModel) hold(p int, c int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[p] += c
}

// reserve starts partition p's reserve, as a stopped fetcher does.
func (m *budgetModel) reserve(p int, least, most int64) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	m.cancels[p], m.done[p] = cancel, ch
	m.wg.Go(func() {
		defer close(ch)
		got, err := m.b.reserve(ctx, p, least, most)
		if err != nil && got != 0 || got != 0 && (got < least || got > most) {
			m.t.Errorf("seed %d: reserve(%d, %d) returned %d, %v", m.seed, least, most, got, err)
		}
		m.hold(p, got)
	})
}

// busy is whether p's reserve is still waiting.
func (m *budgetModel) busy(p int) bool {
	if m.done[p] == nil {
		return false
	}
	select {
	case <-m.done[p]:
		m.done[p] = nil
		return false
	default:
		return true
	}
}

// check fails the test unless the budget's accounting holds: nothing
// negative, the pool's free and lent parts adding up to it, the waiters
// indexed. With settled, it reports whether the waiters are settled: none,
// or the pool stalled and none of them fitting the pool (the first) or
// its own share.
func (m *budgetModel) check(settled bool) bool {
	b := m.b
	b.mu.Lock()
	defer b.mu.Unlock()
	var lent, used int64
	for p, u := range b.used {
		if u < 0 {
			m.t.Fatalf("seed %d: partition %d uses %d", m.seed, p, u)
		}
		lent += b.borrowed(u)
		used += u
	}
	if b.free < 0 || b.free+lent != m.pool || used > m.total || len(b.waiting) != len(b.waiters) {
		m.t.Fatalf("seed %d: free %d, lent %d of a pool of %d; %d used of %d; %d waiting, %d waiters",
			m.seed, b.free, lent, m.pool, used, m.total, len(b.waiting), len(b.waiters))
	}
	if !settled || len(b.waiters) == 0 {
		return true
	}
	if !b.stalled || b.extra(b.waiters[0].partition, b.waiters[0].most) <= b.free {
		return false
	}
	for _, w := range b.waiters {
		if min(b.share-b.used[w.partition], w.most) >= w.least {
			return false
		}
	}
	return true
}
