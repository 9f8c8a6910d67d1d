package postgres_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// A consumer with the Postgres positions, stopped once it has handled
// every record, leaves positions equal to the group's committed offsets in
// Kafka, partition by partition. The commit interval is an hour, so the
// only commits are the generation's first (every partition at its start)
// and the drain's final one (the shutdown's).
func TestPositionsAfterADrainEqualTheCommittedOffsets(t *testing.T) {
	ctx := testContext(t)
	pos := &postgres.Positions{DB: postgres.FromPool(pgtest.NewPool(t))}
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.UniqueName("positions"), kafkatest.UniqueName("positions-group")
	kafkatest.CreateTopic(t, brokers, topic, 3)
	counts := map[int]int{0: 40, 1: 25, 2: 0}
	produce(t, brokers, topic, counts)

	var handled atomic.Int64
	stop := startCounting(t, ctx, brokers, topic, group, pos, &handled)

	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	committed := func() map[int]int64 {
		out, err := kafkagroup.CommittedOffsets(ctx, client, group, topic, []int{0, 1, 2})
		if err != nil {
			t.Fatalf("committed offsets: %v", err)
		}
		for id, o := range out {
			if o < 0 {
				delete(out, id)
			}
		}
		return out
	}
	// Partition 2 had nothing: only the generation's first commit, at 0,
	// with its position written first.
	want := map[int]int64{0: 40, 1: 25, 2: 0}
	poll.Until(t, time.Minute, "every record handled", func() bool { return handled.Load() == 65 })
	if got := committed(); !equal(got, map[int]int64{0: 0, 1: 0, 2: 0}) {
		t.Fatalf("committed %v before the shutdown, with an hour's commit interval; want only the generation's first commit, at 0", got)
	}
	stop()
	if got, kafkaSays := nexts(t, ctx, pos, group, topic), committed(); !equal(got, kafkaSays) || !equal(got, want) {
		t.Fatalf("positions %v, committed offsets %v; want both %v", got, kafkaSays, want)
	}
}

func produce(t *testing.T, brokers []string, topic string, counts map[int]int) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, Transport: &kafka.Transport{},
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return int(m.Key[0]) })}
	defer w.Close()
	var msgs []kafka.Message
	for p, n := range counts {
		for range n {
			msgs = append(msgs, kafka.Message{Key: []byte{byte(p)}, Value: []byte("v")})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// Around a rebalance the old owner's last commit of a revoked partition
// (after its drain) writes its positions first too: with a second member
// joining mid-stream and both stopped at the end, the positions equal
// the committed offsets.
func TestPositionsAcrossARebalanceEqualTheCommittedOffsets(t *testing.T) {
	ctx := testContext(t)
	pos := &postgres.Positions{DB: postgres.FromPool(pgtest.NewPool(t))}
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.UniqueName("positions-rebalance"), kafkatest.UniqueName("positions-rebalance-group")
	kafkatest.CreateTopic(t, brokers, topic, 4)
	var handled atomic.Int64
	start := func() func() { return startCounting(t, ctx, brokers, topic, group, pos, &handled) }
	produce(t, brokers, topic, map[int]int{0: 10, 1: 10, 2: 10, 3: 10})
	stopA := start()
	poll.Until(t, time.Minute, "the first batch handled", func() bool { return handled.Load() == 40 })
	stopB := start() // the rebalance revokes some of A's partitions: A drains and commits them
	produce(t, brokers, topic, map[int]int{0: 5, 1: 5, 2: 5, 3: 5})
	poll.Until(t, time.Minute, "the second batch handled", func() bool { return handled.Load() >= 60 })
	stopA()
	stopB()

	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	committed, err := kafkagroup.CommittedOffsets(ctx, client, group, topic, []int{0, 1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]int64{0: 15, 1: 15, 2: 15, 3: 15}
	if got := nexts(t, ctx, pos, group, topic); !equal(committed, want) || !equal(got, want) {
		t.Fatalf("positions %v, committed offsets %v; want both %v", got, committed, want)
	}
}

// startCounting runs a consumer of topic for group that writes its
// positions to pos and counts each record in handled (an hour's commit
// interval: only the drain's final commit commits). The returned stop
// ends it once, waits for Run and reports its error; the test's cleanup
// calls it too.
func startCounting(t *testing.T, ctx context.Context, brokers []string, topic, group string, pos *postgres.Positions, handled *atomic.Int64) (stop func()) {
	t.Helper()
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, GroupID: group, Concurrency: 4,
		CommitInterval: time.Hour, DrainTimeout: 2 * time.Second, CommitTimeout: 5 * time.Second,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, HeartbeatInterval: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Positions: pos,
	}, func(context.Context, kafka.Message) error {
		handled.Add(1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
