package dlq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/loop"
)

// Backlog is what the dead-letter topic holds that dlq replay has not yet
// consumed: what an operator still has to look at before the topic's
// retention deletes it.
type Backlog struct {
	// Records not replayed by the replay group (its Position), over all
	// partitions, among those still retained.
	Records int64
	// Oldest is the timestamp of the oldest of them; zero when none.
	Oldest time.Time
	// Retention is the topic's retention.ms; 0 when unlimited (-1) or not
	// readable (the client may lack DescribeConfigs on the topic).
	Retention time.Duration
}

// ReadBacklog asks the brokers for the backlog of topic behind the replay
// group: offsets, one record per partition with a backlog (its timestamp),
// and the topic's retention.ms. It reads broker state only and joins no
// group.
func ReadBacklog(ctx context.Context, client *kafka.Client, topic, replayGroup string) (Backlog, error) {
	bounds, err := kafkagroup.LogBounds(ctx, client, topic)
	if err != nil {
		return Backlog{}, err
	}
	ids := slices.Sorted(maps.Keys(bounds))
	positions, err := ReadPositions(ctx, client, replayGroup, topic, ids)
	if err != nil {
		return Backlog{}, err
	}
	var b Backlog
	for _, id := range ids {
		pos := positions[id]
		pos.Start(bounds[id].First) // no commit (-1), or records deleted since
		from := pos.Next            // never replayed: the oldest record of the backlog
		n := bounds[id].End - from - pos.ReplayedIn(from, bounds[id].End)
		if n <= 0 {
			continue
		}
		b.Records += n
		at, err := recordTime(ctx, client, topic, id, from)
		if err != nil {
			return Backlog{}, err
		}
		if !at.IsZero() && (b.Oldest.IsZero() || at.Before(b.Oldest)) {
			b.Oldest = at
		}
	}
	// Without DescribeConfigs on the topic the retention stays unknown (0):
	// the backlog itself is still worth reporting.
	b.Retention, _ = retention(ctx, client, topic)
	return b, nil
}

// recordTime is the timestamp of the first record of partition at or after
// offset (a compressed batch may start before it); zero if none came back.
func recordTime(ctx context.Context, client *kafka.Client, topic string, partition int, offset int64) (time.Time, error) {
	res, err := client.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 500 * time.Millisecond})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, offset, err)
	}
	for {
		rec, err := res.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			return time.Time{}, nil
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("read %s/%d at %d: %w", topic, partition, offset, err)
		}
		if rec.Offset >= offset {
			return rec.Time, nil
		}
	}
}

// retention reads the topic's retention.ms.
func retention(ctx context.Context, client *kafka.Client, topic string) (time.Duration, error) {
	res, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"retention.ms"},
	}}})
	if err != nil {
		return 0, fmt.Errorf("retention of %s: %w", topic, err)
	}
	for _, r := range res.Resources {
		if r.Error != nil {
			return 0, fmt.Errorf("retention of %s: %w", topic, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "retention.ms" {
				ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
				if err != nil || ms < 0 {
					return 0, nil // unlimited, or not a number: no deadline to alert on
				}
				return time.Duration(ms) * time.Millisecond, nil
			}
		}
	}
	return 0, nil
}

// BacklogPass returns the pass of the dead-letter backlog loop (see
// internal/loop): one ReadBacklog, whose answer it hands to report. A
// failure is only the pass's error: the gauges keep their last value (the
// backlog changes slowly, and the lag alerts cover an unreachable Kafka).
func BacklogPass(client *kafka.Client, topic, replayGroup string, report func(Backlog)) func(context.Context) error {
	return func(ctx context.Context) error {
		b, err := ReadBacklog(ctx, client, topic, replayGroup)
		if err == nil && !loop.Stopping(ctx) {
			report(b)
		}
		return err
	}
}
