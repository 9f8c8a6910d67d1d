package e2e

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// addedPartitionsWithin is SPEC §10's bound: partitions added to the topic
// while the service runs are consumed within it, without a restart.
// addedPartitionsWait is how long the test waits before it gives up, so
// that a run that misses the bound still reports what it measured.
const (
	addedPartitionsWithin = 30 * time.Second
	addedPartitionsWait   = 90 * time.Second
)

// TestAddedPartitionsConsumed: two replicas consume a 3-partition topic;
// 6 partitions are added while they run (no restart, no kill) and orders
// are produced across all 9 at once, so that records reach the new
// partitions before the group has assigned them. Every order, also those
// on the new partitions, must be charged within 30 s of the partitions'
// creation: the group rebalances by itself (kafka-go's partition watcher)
// and starts the new partitions at their earliest record, skipping
// nothing. Then SPEC §9 is checked as everywhere.
func TestAddedPartitionsConsumed(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end topology test; runs in make test")
	}
	const before, after = 3, 9
	w := newWorld(t, before, paysim.Faults{})
	first := time.Now().UnixMilli()*10 + 5
	const early, late = 600, 1400
	plan1 := mustPlan(t, harness.Spec{Orders: early, FirstOrderID: first, Seed: 31, Now: time.Now()})
	plan2 := mustPlan(t, harness.Spec{Orders: late, FirstOrderID: first + early, Seed: 32, Now: time.Now()})
	ctx := context.Background()
	if err := harness.Produce(ctx, w.brokers, w.topic, plan1.Records); err != nil {
		t.Fatal(err)
	}
	p1 := w.run(t, "run")
	p2 := w.run(t, "run")
	w.waitDrained(t, p1, 2*time.Minute)

	client := &kafka.Client{Addr: kafka.TCP(w.brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	res, err := client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: w.topic, Count: after}},
	})
	if err == nil {
		err = res.Errors[w.topic]
	}
	if err != nil {
		t.Fatalf("add partitions: %v", err)
	}
	added := time.Now()
	waitPartitions(t, client, w.topic, after)
	if err := harness.Produce(ctx, w.brokers, w.topic, plan2.Records); err != nil {
		t.Fatal(err)
	}
	onNew := 0
	for _, m := range plan2.Records {
		if (&kafka.Hash{}).Balance(m, partitionIDs(after)...) >= before {
			onNew++
		}
	}
	t.Logf("%d partitions added to %s; %d orders produced %.1fs later, %d of them to the added partitions",
		after-before, w.topic, late, time.Since(added).Seconds(), onNew)

	var charged int
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := w.db.QueryRow(qctx, `SELECT count(*) FROM charge WHERE status = 'charged' AND order_id >= $1 AND order_id < $2`,
			first+early, first+early+late).Scan(&charged)
		cancel()
		if err != nil {
			t.Fatalf("count charges: %v", err)
		}
		if charged == late || time.Since(added) > addedPartitionsWait {
			break
		}
		for _, p := range []interface{ Exited() (bool, error) }{p1, p2} {
			if exited, err := p.Exited(); exited {
				t.Fatalf("a consumer exited: %v", err)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	took := time.Since(added)
	if charged < late {
		t.Fatalf("%.0fs after %d partitions were added, %d of the %d orders produced then are still not charged (%d went to the added partitions)",
			took.Seconds(), after-before, late-charged, late, onNew)
	}
	t.Logf("every order produced after the partitions were added was charged %.1fs after they were added", took.Seconds())
	if took > addedPartitionsWithin {
		t.Errorf("orders on added partitions charged %.1fs after the partitions were added, want within %v", took.Seconds(), addedPartitionsWithin)
	}

	w.waitDrained(t, p1, 2*time.Minute)
	report(t, w.verify(t, joinPlans(plan1, plan2), first, early+late))
	for _, p := range []interface{ Stop(time.Duration) error }{p1, p2} {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("graceful stop: %v", err)
		}
	}
}

// waitPartitions polls the brokers' metadata until topic has n partitions,
// so that the producer sees them all.
func waitPartitions(t *testing.T, client *kafka.Client, topic string, n int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ids, err := kafkagroup.Partitions(ctx, client, topic)
		cancel()
		if err == nil && len(ids) == n {
			return
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("metadata of %s: %d partitions (err %v), want %d", topic, len(ids), err, n)
		}
	}
}

func partitionIDs(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	return ids
}

// joinPlans is the plan of two workloads of disjoint order ranges
// produced to one topic.
func joinPlans(a, b harness.Plan) harness.Plan {
	out := harness.Plan{
		Records: append(append([]kafka.Message{}, a.Records...), b.Records...),
		Charged: maps.Clone(a.Charged), Declined: maps.Clone(a.Declined), DLQ: maps.Clone(a.DLQ),
		InvalidValues: maps.Clone(a.InvalidValues), Outcomes: maps.Clone(a.Outcomes), Events: maps.Clone(a.Events),
	}
	maps.Copy(out.Charged, b.Charged)
	maps.Copy(out.Declined, b.Declined)
	maps.Copy(out.InvalidValues, b.InvalidValues)
	maps.Copy(out.Events, b.Events)
	for k, v := range b.DLQ {
		out.DLQ[k] += v
	}
	for k, v := range b.Outcomes {
		out.Outcomes[k] += v
	}
	return out
}
