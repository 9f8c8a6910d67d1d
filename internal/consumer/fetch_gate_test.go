package consumer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// countingGate is a healGate that counts the Hold calls for partition 0:
// its partition loop asks Hold once per event while its first record is
// held, so the count is about the records it fetched.
type countingGate struct {
	*healGate
	holds atomic.Int64
}

func (g *countingGate) Hold(partition int, offset int64) bool {
	if partition == 0 {
		g.holds.Add(1)
	}
	return g.healGate.Hold(partition, offset)
}

// TestHeldPartitionLeavesThePool: during a heal, partition 0 is at its
// target (every record of it held until the gate lifts) with a backlog
// far larger than the budget, and partition 1 must still reach its
// target, past a record larger than its share, for the heal to lift the
// gate. Partition 0's held records must not take the pool that record
// needs: they would hold it until the gate lifts, which waits for
// partition 1 (a deadlock, the whole consumer's outage). It runs with
// shares worth a fetch, and with smaller ones, which wait for the pool
// first (see worthAFetch).
func TestHeldPartitionLeavesThePool(t *testing.T) {
	for _, c := range []struct {
		name    string
		budgets int64 // maximal records
	}{{"shares worth a fetch", 4}, {"small shares", 3}} {
		t.Run(c.name, func(t *testing.T) { testHeldPartitionLeavesThePool(t, c.budgets) })
	}
}

func testHeldPartitionLeavesThePool(t *testing.T, budgets int64) {
	const partitions, backlog, below = 8, 300, 10
	env := newKafkaEnv(t, partitions)
	w := env.writer()
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var msgs []kafka.Message
	for i := range backlog {
		msgs = append(msgs, kafka.Message{Key: partitionKey(0, i), Value: make([]byte, 100)})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	gate := &countingGate{healGate: newHealGate()}
	gate.set(true, map[int]int64{0: 0, 1: below}) // partition 0 held from 0; 1 until 10
	cfg := env.config(t)
	cfg.Gate = gate
	cfg.Concurrency, cfg.CommitInterval = 8, 20*time.Millisecond
	cfg.MaxRecordBytes = 16 << 10
	// 4: a pool of 2 maximal records, a share of 4,224 bytes, a quarter
	// of one; 3: a pool of 1.5, a share of 3,168.
	cfg.MaxInFlightBytes = budgets * cfg.maxCost()
	startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error { return nil })
	// Partition 0 fetches its held backlog: all the budget lets it (its
	// share and the pool, about 60 records, before the fix; its share
	// only, 5 or 6, after), in well under a second.
	poll.Until(t, waitLong, "partition 0 fetching its held backlog", func() bool { return gate.holds.Load() >= 4 })
	time.Sleep(time.Second)

	msgs = msgs[:0]
	for i := range below {
		v := make([]byte, 100)
		if i == 3 {
			v = make([]byte, 8<<10) // larger than the share: it needs the pool
		}
		msgs = append(msgs, kafka.Message{Key: partitionKey(1, i), Value: v})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for env.lags(t)[1].Committed < below {
		if time.Now().After(deadline) {
			t.Fatalf("partition 1 committed %d of the %d records below its target in 15 s (partition 0 asked Hold %d times): the heal cannot lift",
				env.lags(t)[1].Committed, below, gate.holds.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	gate.set(false, nil) // the heal lifts: partition 0 goes on
	poll.Until(t, waitLong, "everything committed", func() bool { return committedAtEnd(env.lags(t)) })
}
