package consumer

import (
	"context"
	"maps"
	"slices"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/loop"
)

// PartitionLag is the position of a consumer group in one partition.
type PartitionLag struct {
	Partition int
	// Committed is the group's committed offset, or -1 when it has none.
	Committed int64
	// End is the log-end offset (the offset the next record will get).
	End int64
	// Lag is End minus Committed; with no committed offset, End minus the
	// earliest retained offset.
	Lag int64
}

// GroupLag asks the brokers for the log-end offsets of topic and the
// committed offsets of group, partition by partition. It reads only broker
// state, so it is right while this replica is stuck, paused or owns none of
// the partitions.
func GroupLag(ctx context.Context, client *kafka.Client, topic, group string) ([]PartitionLag, error) {
	bounds, err := kafkagroup.LogBounds(ctx, client, topic)
	if err != nil {
		return nil, err
	}
	ids := slices.Sorted(maps.Keys(bounds))
	com, err := kafkagroup.CommittedOffsets(ctx, client, group, topic, ids)
	if err != nil {
		return nil, err
	}
	out := make([]PartitionLag, 0, len(ids))
	for _, id := range ids {
		b := bounds[id]
		l := PartitionLag{Partition: id, Committed: -1, End: b.End}
		if c, ok := com[id]; ok && c >= 0 {
			l.Committed = c
			l.Lag = l.End - c
		} else {
			l.Lag = l.End - b.First
		}
		out = append(out, l)
	}
	return out, nil
}

// LagPass returns the pass of the lag loop (see internal/loop): one
// GroupLag, whose answer or error it hands to report unless the loop is
// stopping. Its error is GroupLag's.
func LagPass(client *kafka.Client, topic, group string, report func([]PartitionLag, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		lags, err := GroupLag(ctx, client, topic, group)
		if loop.Stopping(ctx) {
			return err
		}
		report(lags, err)
		return err
	}
}
