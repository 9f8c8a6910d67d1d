package e2e

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// TestSmallBudgetStarvesNoPartition (issue 22): a backlog of 4,000 orders
// on 24 partitions, consumed by one replica whose in-flight budget holds
// about a hundred records (BILLING_MAX_INFLIGHT_BYTES=64KiB) while
// BILLING_CONCURRENCY allows 1,024, so fetching pauses all the time; the
// provider takes 2 ms a charge, and answers 503 for one order (a slow key)
// until every other partition is committed to its end (each keeps its
// share of the budget; the records done behind the slow one hold 64 bytes
// each), which takes a second or two (BILLING_PARK_AFTER, 30 s, would
// release the slow order's partition anyway, on a machine far slower);
// once it recovers, everything is charged exactly once and committed.
func TestSmallBudgetStarvesNoPartition(t *testing.T) {
	const (
		orders     = 4_000
		partitions = 24
	)
	w := newWorld(t, partitions, paysim.Faults{Latency: 2 * time.Millisecond})
	first := time.Now().UnixMilli() * 10
	plan := mustPlan(t, harness.Spec{Orders: orders, FirstOrderID: first, Seed: 22, Now: time.Now()})
	slow := orderOf(t, plan.Records[5])
	var recovered atomic.Bool
	w.sim.SetFaults(paysim.Faults{Latency: 2 * time.Millisecond,
		Unavailable: func(o int64) bool { return o == slow && !recovered.Load() }})
	ctx := context.Background()
	if err := harness.Produce(ctx, w.brokers, w.topic, plan.Records); err != nil {
		t.Fatal(err)
	}
	p := w.start(t, []string{"BILLING_MAX_INFLIGHT_BYTES=65536", "BILLING_KAFKA_MAX_RECORD_BYTES=16384"}, "run")
	start := time.Now()
	poll.Until(t, 2*time.Minute, "every partition but the slow order's committed to its end", func() bool {
		lags, err := harness.Lag(ctx, w.brokers, w.topic, w.group)
		if err != nil || len(lags) != partitions {
			return false
		}
		behind := 0
		for _, l := range lags {
			if l.Committed != l.End {
				behind++
			}
		}
		return behind <= 1
	})
	held := time.Since(start)
	if w.sim.ChargesFor(slow) != 0 {
		t.Fatalf("the slow order was charged before the others were committed: the test proves nothing")
	}
	t.Logf("every other partition committed to its end %v after the start, the slow order still failing", held.Round(time.Millisecond))
	recovered.Store(true)
	w.waitDrained(t, p, 2*time.Minute)
	w.waitSettled(t, p)
	if n := w.sim.ChargesFor(slow); n != 1 {
		t.Errorf("the slow order was charged %d times, want once", n)
	}
	report(t, w.verify(t, plan, first, orders))
}
