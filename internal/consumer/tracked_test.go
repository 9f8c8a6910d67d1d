package consumer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/poll"
)

// TestPartitionBillsBehindAWaitingRecord: while one record waits (its
// order failing at the provider, until it is parked), its partition goes
// on handling the records behind it, up to 32 windows of them tracked (1
// MiB of entries at the default window: about 15 s of a backlog's drain,
// which the bench's failing row needs), and only then stops fetching;
// nothing is committed past the waiting record until it finishes.
func TestPartitionBillsBehindAWaitingRecord(t *testing.T) {
	const window = 4
	const bound = 32 * window // entries tracked, the waiting one included
	env := newKafkaEnv(t, 1)
	w := env.writer()
	defer w.Close()
	var msgs []kafka.Message
	for i := range bound + 50 {
		msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "0/k%d", i), Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var handled atomic.Int32
	cfg := env.config(t)
	cfg.Concurrency = 8
	cfg.PartitionWindow = window
	cfg.CommitInterval = 20 * time.Millisecond
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		if msg.Offset == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		handled.Add(1)
		return nil
	})
	poll.Until(t, waitLong, fmt.Sprintf("the %d records behind the waiting one handled", bound-1), func() bool {
		return handled.Load() >= int32(bound-1)
	})
	time.Sleep(300 * time.Millisecond) // give a wrong implementation the chance to fetch more
	if n := handled.Load(); n != int32(bound-1) {
		t.Fatalf("%d records handled behind the waiting one; want %d (32 windows of %d tracked)", n, bound-1, window)
	}
	if l := env.lags(t)[0]; l.Committed > 0 {
		t.Fatalf("committed %d past the waiting record", l.Committed)
	}
	close(release)
	poll.Until(t, waitLong, "everything committed", func() bool { return env.lags(t)[0].Committed == int64(len(msgs)) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestReleasedRecordsCommittedAtOnce: when a waiting record finishes and
// releases a window or more of records done behind it, they are committed
// at once, not at the next commit tick (an hour here): they have waited
// for the parked record long enough.
func TestReleasedRecordsCommittedAtOnce(t *testing.T) {
	const window = 4
	env := newKafkaEnv(t, 1)
	w := env.writer()
	defer w.Close()
	var msgs []kafka.Message
	for i := range 3 * window {
		msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "0/k%d", i), Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var handled atomic.Int32
	cfg := env.config(t)
	cfg.Concurrency = 8
	cfg.PartitionWindow = window
	cfg.CommitInterval = time.Hour
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		if msg.Offset == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		handled.Add(1)
		return nil
	})
	poll.Until(t, waitLong, "the records behind the waiting one handled", func() bool { return handled.Load() == int32(len(msgs)-1) })
	close(release)
	poll.Until(t, waitLong, "everything committed before the next tick", func() bool { return env.lags(t)[0].Committed == int64(len(msgs)) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}
