package kafkagroup_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// A marked commit made as a member of a generation reads back with its
// mark; one made under a generation the group no longer has is refused
// with an error Rebalanced recognises, and changes nothing.
func TestCommitMarkedRoundTripAndFencing(t *testing.T) {
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.UniqueName("mark-test"), kafkatest.UniqueName("mark-test-group")
	kafkatest.CreateTopic(t, brokers, topic, 2)
	g, err := kafkagroup.Join(kafkagroup.GroupConfig{ID: group, Brokers: brokers, Topic: topic,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer kafkagroup.Leave(g, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gen, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Timeout: 10 * time.Second}
	want := map[int]kafkagroup.MarkedOffset{
		0: {Offset: 0, Mark: kafkagroup.Mark{Frontier: 256, Since: 0}},
		1: {Offset: 7, Mark: kafkagroup.Mark{Frontier: 1 << 33, Since: 3}},
	}
	if err := kafkagroup.CommitMarked(client, gen, topic, want, 10*time.Second); err != nil {
		t.Fatalf("CommitMarked: %v", err)
	}
	got, err := kafkagroup.CommittedMarks(ctx, client, group, topic, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	for id, w := range want {
		if c := got[id]; !c.Marked || c.Offset != w.Offset || c.Mark != w.Mark {
			t.Errorf("partition %d: read back %+v, want %+v", id, c, w)
		}
	}

	stale := &kafka.Generation{ID: gen.ID + 1, GroupID: gen.GroupID, MemberID: gen.MemberID}
	err = kafkagroup.CommitMarked(client, stale, topic, map[int]kafkagroup.MarkedOffset{0: {Offset: 5, Mark: kafkagroup.Mark{Frontier: 9}}}, 10*time.Second)
	if err == nil || !kafkagroup.Rebalanced(err) {
		t.Fatalf("commit under another generation: %v; want an error Rebalanced recognises", err)
	}
	if got, _ := kafkagroup.CommittedMarks(ctx, client, group, topic, []int{0}); got[0].Offset != 0 {
		t.Errorf("partition 0 committed %+v after the refused commit, want 0 unchanged", got[0])
	}
}

// BenchmarkCommit compares one commit of 12 partitions by kafka-go's
// Generation.CommitOffsets (no metadata, the generation's coordinator
// connection) with CommitMarked (a mark per partition, through a
// kafka.Client): what a flush's Kafka half costs.
func BenchmarkCommit(b *testing.B) {
	brokers := kafkatest.Brokers(b)
	topic, group := kafkatest.UniqueName("mark-bench"), kafkatest.UniqueName("mark-bench-group")
	kafkatest.CreateTopic(b, brokers, topic, 12)
	g, err := kafkagroup.Join(kafkagroup.GroupConfig{ID: group, Brokers: brokers, Topic: topic,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer kafkagroup.Leave(g, 10*time.Second)
	gen, err := g.Next(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Timeout: 10 * time.Second}
	b.Run("plain", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			offsets := map[int]int64{}
			for p := range 12 {
				offsets[p] = int64(i)
			}
			if err := kafkagroup.Commit(gen, topic, offsets, 10*time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("marked", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			offsets := map[int]kafkagroup.MarkedOffset{}
			for p := range 12 {
				offsets[p] = kafkagroup.MarkedOffset{Offset: int64(i), Mark: kafkagroup.Mark{Frontier: int64(i) + 1<<16, Since: 0}}
			}
			if err := kafkagroup.CommitMarked(client, gen, topic, offsets, 10*time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
}
