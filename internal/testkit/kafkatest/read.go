package kafkatest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// ReadOptions narrow ReadTopic; the zero value reads everything.
type ReadOptions struct {
	// From is the first offset to read of each partition; a partition
	// that is absent, or whose offset is negative, is read from its
	// earliest retained record.
	From map[int]int64
	// Limit caps the records read from each partition; zero: no cap.
	Limit int
	// MaxBytes is the largest fetch; zero: 10 MiB.
	MaxBytes int
}

// ReadTopic returns the records of topic from the start (or opts.From) up
// to the log-end offsets at the time of the call, by partition, then
// offset: it ends even while records keep arriving. It retries for a few
// seconds while the broker is not ready (just created, restarted or
// resumed). It is for tests and harnesses on a plaintext broker.
func ReadTopic(ctx context.Context, brokers []string, topic string, opts ReadOptions) ([]kafka.Message, error) {
	bounds, err := logBounds(ctx, brokers, topic)
	if err != nil {
		return nil, err
	}
	var out []kafka.Message
	for _, id := range slices.Sorted(maps.Keys(bounds)) {
		b := bounds[id]
		from, ok := opts.From[id]
		if !ok || from < b.First {
			from = b.First
		}
		if from >= b.End {
			continue
		}
		r, err := kafkagroup.OpenPartition(kafkagroup.ReaderConfig{Brokers: brokers, Topic: topic,
			Partition: id, MaxBytes: opts.MaxBytes}, from)
		if err != nil {
			return nil, err
		}
		for n := 0; opts.Limit == 0 || n < opts.Limit; n++ {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				_ = r.Close()
				return nil, fmt.Errorf("read %s/%d: %w", topic, id, err)
			}
			out = append(out, m)
			if m.Offset+1 >= b.End {
				break
			}
		}
		_ = r.Close()
	}
	return out, nil
}

// MustReadTopic is ReadTopic of everything for a test, bounded by 30 s:
// an error fails t.
func MustReadTopic(t testing.TB, brokers []string, topic string) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := ReadTopic(ctx, brokers, topic, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// logBounds is kafkagroup.LogBounds, retried for up to 4 s while the
// broker answers with errors.
func logBounds(ctx context.Context, brokers []string, topic string) (map[int]kafkagroup.Bounds, error) {
	var err error
	for range 20 {
		tr := &kafka.Transport{}
		client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
		var bounds map[int]kafkagroup.Bounds
		bounds, err = kafkagroup.LogBounds(ctx, client, topic)
		tr.CloseIdleConnections()
		if err == nil {
			return bounds, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, err
}
