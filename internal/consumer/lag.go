package consumer

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
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

// WatchLag calls GroupLag every interval until ctx ends and hands each
// answer, or its error, to report (never the error of ctx ending).
// Failures are logged at most once a minute.
func WatchLag(ctx context.Context, client *kafka.Client, topic, group string, interval time.Duration,
	logger *slog.Logger, report func([]PartitionLag, error)) {
	var lastLogged time.Time
	kafkagroup.Every(ctx, interval, func(qctx context.Context) {
		lags, err := GroupLag(qctx, client, topic, group)
		if ctx.Err() != nil {
			return
		}
		report(lags, err)
		if err != nil && time.Since(lastLogged) > time.Minute {
			logger.Warn("consumer lag unavailable", "err", err)
			lastLogged = time.Now()
		}
	})
}
