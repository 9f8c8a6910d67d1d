package consumer

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/billing-consumer/billing-consumer/internal/loop"
)

// commitOffsets commits offsets for env's group as a standalone client
// (generation -1, no member), as kafka-consumer-groups --reset-offsets does.
func (env *kafkaEnv) commitOffsets(t *testing.T, offsets map[int]int64) {
	t.Helper()
	var commits []kafka.OffsetCommit
	for p, o := range offsets {
		commits = append(commits, kafka.OffsetCommit{Partition: p, Offset: o})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := env.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID: env.group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{env.topic: commits},
	})
	if err != nil {
		t.Fatalf("commit offsets: %v", err)
	}
	for _, p := range res.Topics[env.topic] {
		if p.Error != nil {
			t.Fatalf("commit offset of partition %d: %v", p.Partition, p.Error)
		}
	}
}

// deleteRecordsBefore moves the earliest retained offset of partition up to
// offset, as retention would. kafka-go has no DeleteRecords, franz-go does.
func (env *kafkaEnv) deleteRecordsBefore(t *testing.T, partition int32, offset int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.brokers...))
	if err != nil {
		t.Fatalf("franz-go client: %v", err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.TimeoutMillis = 10_000
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = env.topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	for _, tp := range res.Topics {
		for _, p := range tp.Partitions {
			if p.ErrorCode != 0 || p.LowWatermark != offset {
				t.Fatalf("delete records of partition %d: error code %d, low watermark %d, want %d", p.Partition, p.ErrorCode, p.LowWatermark, offset)
			}
		}
	}
}

// TestGroupLag: lag is end minus committed, and end minus the earliest
// retained offset where the group has committed nothing.
func TestGroupLag(t *testing.T) {
	env := newKafkaEnv(t, 3)
	env.produce(t, map[int]int{0: 5, 1: 3})
	env.deleteRecordsBefore(t, 1, 2) // partition 1 now holds only offset 2

	want := map[int]PartitionLag{
		0: {Partition: 0, Committed: -1, End: 5, Lag: 5},
		1: {Partition: 1, Committed: -1, End: 3, Lag: 1},
		2: {Partition: 2, Committed: -1, End: 0, Lag: 0},
	}
	if got := env.lags(t); !equalLags(got, want) {
		t.Errorf("nothing committed: GroupLag = %+v, want %+v", got, want)
	}

	env.commitOffsets(t, map[int]int64{0: 2, 1: 3})
	want[0] = PartitionLag{Partition: 0, Committed: 2, End: 5, Lag: 3}
	want[1] = PartitionLag{Partition: 1, Committed: 3, End: 3, Lag: 0}
	if got := env.lags(t); !equalLags(got, want) {
		t.Errorf("after commits: GroupLag = %+v, want %+v", got, want)
	}
}

func equalLags(got, want map[int]PartitionLag) bool {
	if len(got) != len(want) {
		return false
	}
	for p, w := range want {
		if got[p] != w {
			return false
		}
	}
	return true
}

// TestLagLoop: the lag loop (LagPass run by loop.Loop, as the service
// registers it) reports repeatedly and returns when ctx ends. Each query
// is bounded by the interval, so the interval leaves a loaded broker time
// to answer (at 50ms, OffsetFetch timed out under load).
func TestLagLoop(t *testing.T) {
	env := newKafkaEnv(t, 3)
	env.produce(t, map[int]int{2: 4})

	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan []PartitionLag, 100)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		lag := loop.Loop{Interval: 500 * time.Millisecond, Timeout: 500 * time.Millisecond,
			RunOnce: LagPass(env.client, env.topic, env.group, func(l []PartitionLag, err error) {
				if err != nil {
					t.Errorf("lag query: %v", err)
					return
				}
				select {
				case reports <- l:
				default:
				}
			})}
		lag.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	t.Cleanup(func() {
		cancel()
		<-returned
	})
	for i := range 2 {
		select {
		case l := <-reports:
			var p2 PartitionLag
			for _, pl := range l {
				if pl.Partition == 2 {
					p2 = pl
				}
			}
			if len(l) != 3 || p2.End != 4 || p2.Lag != 4 {
				t.Fatalf("report %d: %+v, want 3 partitions, partition 2 with end 4 and lag 4", i, l)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no report %d from the lag loop", i)
		}
	}
	cancel()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the lag loop did not return after its context ended")
	}
}
