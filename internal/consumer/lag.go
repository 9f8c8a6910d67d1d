package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
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
	parts := meta.Topics[0].Partitions
	var ends, firsts []kafka.OffsetRequest
	ids := make([]int, 0, len(parts))
	for _, p := range parts {
		ids = append(ids, p.ID)
		ends = append(ends, kafka.LastOffsetOf(p.ID))
		firsts = append(firsts, kafka.FirstOffsetOf(p.ID))
	}
	endRes, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: ends}})
	if err != nil {
		return nil, fmt.Errorf("log-end offsets of %s: %w", topic, err)
	}
	firstRes, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: firsts}})
	if err != nil {
		return nil, fmt.Errorf("earliest offsets of %s: %w", topic, err)
	}
	committed, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	// A group that never committed is "not found" on some brokers (kfake)
	// and has offset -1 on others: both mean nothing committed.
	if committed.Error != nil && !errors.Is(committed.Error, kafka.GroupIdNotFound) {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, committed.Error)
	}
	end := map[int]int64{}
	for _, po := range endRes.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("log-end offset of %s/%d: %w", topic, po.Partition, po.Error)
		}
		end[po.Partition] = po.LastOffset
	}
	first := map[int]int64{}
	for _, po := range firstRes.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("earliest offset of %s/%d: %w", topic, po.Partition, po.Error)
		}
		first[po.Partition] = po.FirstOffset
	}
	com := map[int]int64{}
	for _, po := range committed.Topics[topic] {
		if po.Error == nil {
			com[po.Partition] = po.CommittedOffset
		}
	}
	out := make([]PartitionLag, 0, len(ids))
	for _, id := range ids {
		l := PartitionLag{Partition: id, Committed: -1, End: end[id]}
		if c, ok := com[id]; ok && c >= 0 {
			l.Committed = c
			l.Lag = l.End - c
		} else {
			l.Lag = l.End - first[id]
		}
		out = append(out, l)
	}
	return out, nil
}

// WatchLag calls GroupLag every interval until ctx ends and hands each
// answer to report. Failures are logged at most once a minute.
func WatchLag(ctx context.Context, client *kafka.Client, topic, group string, interval time.Duration,
	logger *slog.Logger, report func([]PartitionLag)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastLogged time.Time
	for {
		qctx, cancel := context.WithTimeout(ctx, interval)
		lags, err := GroupLag(qctx, client, topic, group)
		cancel()
		switch {
		case err == nil:
			report(lags)
		case ctx.Err() == nil && time.Since(lastLogged) > time.Minute:
			logger.Warn("consumer lag unavailable", "err", err)
			lastLogged = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
