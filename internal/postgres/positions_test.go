package postgres_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func nexts(t *testing.T, ctx context.Context, p *postgres.Positions, group, topic string) map[int]int64 {
	t.Helper()
	got, err := p.List(ctx, group, topic)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	out := map[int]int64{}
	for id, pos := range got {
		out[id] = pos.Next
	}
	return out
}

// A position only moves forward: a later write of an older offset (a
// commit that lands late, a slower replica) leaves it where it is, and a
// partition without a row gets one at its first write. Other groups and
// topics are apart.
func TestPositionsOnlyMoveForward(t *testing.T) {
	ctx := testContext(t)
	p := &postgres.Positions{DB: postgres.FromPool(pgtest.NewPool(t))}
	steps := []struct {
		write map[int]int64
		want  map[int]int64
	}{
		{map[int]int64{0: 10, 1: 5}, map[int]int64{0: 10, 1: 5}},
		{map[int]int64{0: 7, 2: 3}, map[int]int64{0: 10, 1: 5, 2: 3}}, // 7 < 10 loses; 2 is filled
		{map[int]int64{0: 10, 1: 6}, map[int]int64{0: 10, 1: 6, 2: 3}},
		{map[int]int64{}, map[int]int64{0: 10, 1: 6, 2: 3}},
	}
	for i, s := range steps {
		if err := p.Advance(ctx, "g", "t", s.write); err != nil {
			t.Fatalf("step %d: Advance(%v): %v", i, s.write, err)
		}
		if got := nexts(t, ctx, p, "g", "t"); !equal(got, s.want) {
			t.Fatalf("step %d: after Advance(%v) positions %v, want %v", i, s.write, got, s.want)
		}
	}
	if err := p.Advance(ctx, "other", "t", map[int]int64{0: 1}); err != nil {
		t.Fatal(err)
	}
	if got := nexts(t, ctx, p, "g", "t"); got[0] != 10 {
		t.Fatalf("another group's write moved g's position: %v", got)
	}
}

// Concurrent writers of overlapping partitions, each writing its own
// offsets in random order: every write succeeds (no deadlock, no unique
// violation on the first fill) and each partition ends at the highest
// offset any writer wrote.
func TestPositionsConcurrentWritersKeepTheHighest(t *testing.T) {
	ctx := testContext(t)
	p := &postgres.Positions{DB: postgres.FromPool(pgtest.NewPool(t))}
	const writers, writes, partitions = 8, 40, 6
	var mu sync.Mutex
	highest := map[int]int64{}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range writes {
				offs := map[int]int64{}
				for id := range partitions {
					if r.IntN(2) == 0 {
						offs[id] = r.Int64N(1_000_000)
					}
				}
				if err := p.Advance(ctx, "g", "t", offs); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for id, o := range offs {
					highest[id] = max(highest[id], o)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a concurrent Advance failed: %v", err)
	}
	if got := nexts(t, ctx, p, "g", "t"); !equal(got, highest) {
		t.Fatalf("positions %v, want the highest written %v", got, highest)
	}
}

// Accept moves positions forward to the targets, never back, and audits
// each move (before NULL for a partition without a row) in the same
// transaction; it refuses without an operator or a reason.
func TestAcceptMovesForwardAndAudits(t *testing.T) {
	ctx := testContext(t)
	pool := pgtest.NewPool(t)
	p := &postgres.Positions{DB: postgres.FromPool(pool)}
	if err := p.Advance(ctx, "g", "t", map[int]int64{0: 10, 1: 50}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Accept(ctx, "g", "t", map[int]int64{0: 20}, postgres.Audit{Operator: "ann"}); !errors.Is(err, postgres.ErrNoAudit) {
		t.Fatalf("Accept without a reason: %v, want ErrNoAudit", err)
	}
	got, err := p.Accept(ctx, "g", "t", map[int]int64{0: 20, 1: 40, 2: 7}, postgres.Audit{Operator: "ann", Host: "h", Reason: "INC-1 reset"})
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	want := []postgres.Accepted{
		{Partition: 0, Before: 10, After: 20, Moved: true},
		{Partition: 1, Before: 50, After: 50},
		{Partition: 2, Before: -1, After: 7, Moved: true},
	}
	if len(got) != len(want) {
		t.Fatalf("Accept = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Accept[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := nexts(t, ctx, p, "g", "t"); !equal(n, map[int]int64{0: 20, 1: 50, 2: 7}) {
		t.Errorf("positions after Accept %v", n)
	}
	rows, err := pool.Query(ctx, `SELECT partition, before, after, operator, host, reason FROM position_audit ORDER BY partition`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type audit struct {
		part          int
		before        *int64
		after         int64
		op, host, why string
	}
	var audits []audit
	for rows.Next() {
		var a audit
		if err := rows.Scan(&a.part, &a.before, &a.after, &a.op, &a.host, &a.why); err != nil {
			t.Fatal(err)
		}
		audits = append(audits, a)
	}
	if len(audits) != 2 || audits[0].part != 0 || audits[0].before == nil || *audits[0].before != 10 || audits[0].after != 20 ||
		audits[1].part != 2 || audits[1].before != nil || audits[1].after != 7 || audits[0].op != "ann" || audits[0].why != "INC-1 reset" {
		t.Fatalf("audit rows %+v, want partition 0 (10 -> 20) and 2 (none -> 7) by ann", audits)
	}
}

func equal(a, b map[int]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// BenchmarkAdvance is the cost of one commit's positions write: all 12
// partitions of a replica moving forward, one statement.
func BenchmarkAdvance(b *testing.B) {
	ctx := context.Background()
	p := &postgres.Positions{DB: postgres.FromPool(pgtest.NewPool(b))}
	offs := map[int]int64{}
	next := int64(0)
	for b.Loop() {
		next++
		for id := range 12 {
			offs[id] = next
		}
		if err := p.Advance(ctx, "g", "t", offs); err != nil {
			b.Fatal(err)
		}
	}
}
