package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// addPartitions grows env's topic to n partitions and waits until the
// brokers' metadata shows them.
func (env *kafkaEnv) addPartitions(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := env.client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: env.topic, Count: int32(n)}},
	})
	if err == nil {
		err = res.Errors[env.topic]
	}
	if err != nil {
		t.Fatalf("add partitions to %s: %v", env.topic, err)
	}
	poll.Until(t, 30*time.Second, "the added partitions in the metadata", func() bool {
		return len(env.lags(t)) == n
	})
}

// TestAddedPartitionsAreConsumed: with the default partition watch, a
// consumer picks up partitions added to its topic while it runs, from
// their first record (produced before the group assigned them), without
// a restart.
func TestAddedPartitionsAreConsumed(t *testing.T) {
	env := newKafkaEnv(t, 1)
	h := newHandled()
	r := startConsumer(t, env.config(t), func(_ context.Context, m kafka.Message) error { h.add(m); return nil })
	counts := map[int]int{0: 5}
	env.produce(t, counts)
	poll.Until(t, waitLong, "partition 0 consumed", func() bool { return h.covers(ends(counts)) })
	gen, _ := r.Generation()

	env.addPartitions(t, 3)
	counts = map[int]int{0: 5, 1: 7, 2: 9}
	env.produce(t, map[int]int{1: 7, 2: 9})
	poll.Until(t, waitLong, "the added partitions consumed from their first record and committed", func() bool {
		return h.covers(ends(counts)) && committedAtEnd(env.lags(t))
	})
	if g, _ := r.Generation(); g.ID == gen.ID || g.Partitions != 3 {
		t.Errorf("generation %+v after the partitions were added (was %+v), want a new one with 3 partitions", g, gen)
	}
}

// TestRejoinOfTheLeaderReassigns: a group whose leader did not notice the
// added partitions (partition watch off here; the watcher's race in
// production) leaves them to nobody in a stable generation, until its
// leader rejoins: then the coordinator rebalances and the leader assigns
// them.
func TestRejoinOfTheLeaderReassigns(t *testing.T) {
	env := newKafkaEnv(t, 1)
	h := newHandled()
	cfg := env.config(t)
	cfg.PartitionWatchInterval = -1
	r := startConsumer(t, cfg, func(_ context.Context, m kafka.Message) error { h.add(m); return nil })
	env.produce(t, map[int]int{0: 3})
	poll.Until(t, waitLong, "partition 0 consumed", func() bool { return h.covers(ends(map[int]int{0: 3})) })

	env.addPartitions(t, 3)
	env.produce(t, map[int]int{1: 4, 2: 4})
	counts := map[int]int{0: 3, 1: 4, 2: 4}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	poll.Until(t, waitLong, "the stable group leaving partitions 1 and 2 unassigned", func() bool {
		a, err := AssignmentOf(ctx, env.client, env.topic, env.group)
		return err == nil && a.State == "Stable" && len(a.Unassigned) == 2
	})
	if h.count() != 3 {
		t.Fatalf("%d records handled, want partition 0's 3: nobody owns the others", h.count())
	}

	r.Rejoin()
	poll.Until(t, waitLong, "the added partitions consumed after the rejoin", func() bool {
		return h.covers(ends(counts)) && committedAtEnd(env.lags(t))
	})
}
