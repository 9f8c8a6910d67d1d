package kafkagroup

import (
	"context"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// Bounds are a partition's earliest retained offset and its log-end offset
// (the offset the next record will get).
type Bounds struct{ First, End int64 }

// Partitions asks the brokers for the partition ids of topic.
func Partitions(ctx context.Context, client *kafka.Client, topic string) ([]int, error) {
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		var terr error = errors.New("not found")
		if len(meta.Topics) == 1 {
			terr = meta.Topics[0].Error
		}
		return nil, fmt.Errorf("metadata of %s: %w", topic, terr)
	}
	ids := make([]int, 0, len(meta.Topics[0].Partitions))
	for _, p := range meta.Topics[0].Partitions {
		ids = append(ids, p.ID)
	}
	return ids, nil
}

// LogBounds asks the brokers for the earliest and log-end offsets of every
// partition of topic.
func LogBounds(ctx context.Context, client *kafka.Client, topic string) (map[int]Bounds, error) {
	ids, err := Partitions(ctx, client, topic)
	if err != nil {
		return nil, err
	}
	var firsts, ends []kafka.OffsetRequest
	for _, id := range ids {
		firsts = append(firsts, kafka.FirstOffsetOf(id))
		ends = append(ends, kafka.LastOffsetOf(id))
	}
	out := make(map[int]Bounds, len(firsts))
	list := func(q []kafka.OffsetRequest, set func(*Bounds, kafka.PartitionOffsets)) error {
		res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: q}})
		if err != nil {
			return fmt.Errorf("offsets of %s: %w", topic, err)
		}
		for _, po := range res.Topics[topic] {
			if po.Error != nil {
				return fmt.Errorf("offsets of %s/%d: %w", topic, po.Partition, po.Error)
			}
			b := out[po.Partition]
			set(&b, po)
			out[po.Partition] = b
		}
		return nil
	}
	if err := list(firsts, func(b *Bounds, po kafka.PartitionOffsets) { b.First = po.FirstOffset }); err != nil {
		return nil, err
	}
	if err := list(ends, func(b *Bounds, po kafka.PartitionOffsets) { b.End = po.LastOffset }); err != nil {
		return nil, err
	}
	return out, nil
}

// CommittedOffsets asks the brokers for group's committed offsets of the
// partitions ids of topic. A partition without a committed offset is
// absent or -1: a group that never committed is "not found" on some
// brokers (kfake) and has offset -1 on others, and both mean nothing
// committed.
func CommittedOffsets(ctx context.Context, client *kafka.Client, group, topic string, ids []int) (map[int]int64, error) {
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	if res.Error != nil && !errors.Is(res.Error, kafka.GroupIdNotFound) {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, res.Error)
	}
	out := map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error == nil {
			out[po.Partition] = po.CommittedOffset
		}
	}
	return out, nil
}
