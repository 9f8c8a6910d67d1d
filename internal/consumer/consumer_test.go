package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/field"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
	"github.com/segmentio/kafka-go"
)

func TestNewRequiresBrokersTopicGroupLogger(t *testing.T) {
	valid := Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	nop := func(context.Context, kafka.Message) error { return nil }
	tests := []struct {
		name   string
		modify func(*Config)
	}{
		{"no brokers", func(c *Config) { c.Brokers = nil }},
		{"no topic", func(c *Config) { c.Topic = "" }},
		{"no group", func(c *Config) { c.GroupID = "" }},
		{"no logger", func(c *Config) { c.Logger = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.modify(&cfg)
			if _, err := New(cfg, nop); err == nil {
				t.Errorf("New accepted a config with %s", tt.name)
			}
		})
	}
	c, err := New(valid, nop)
	if err != nil {
		t.Fatalf("New(valid) = %v", err)
	}
	if c.Joined() {
		t.Error("Joined() before Run")
	}
}

// TestConsumesEverythingAndCommitsToEnd: every record is handled, in offset
// order within its partition, and once Run has returned the group's
// committed offsets are the log-end offsets.
func TestConsumesEverythingAndCommitsToEnd(t *testing.T) {
	env := newKafkaEnv(t, 3)
	counts := map[int]int{0: 20, 1: 13, 2: 7}
	env.produce(t, counts)

	h := newHandled()
	var commitMu sync.Mutex
	commits := map[int][]int64{}
	commitFetched, commitUntimed := 0, 0
	cfg := env.config(t)
	cfg.OnCommit = func(partition int, offset int64, fetched []Timing) {
		commitMu.Lock()
		defer commitMu.Unlock()
		commits[partition] = append(commits[partition], offset)
		commitFetched += len(fetched)
		for _, tm := range fetched {
			if tm.Produced.IsZero() || tm.Fetched.IsZero() {
				commitUntimed++
			}
		}
	}
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		h.add(msg)
		return nil
	})
	poll.Until(t, waitLong, "every record handled", func() bool { return h.covers(ends(counts)) })
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v, want nil after cancellation", err)
	}

	lags := env.lags(t)
	for p, n := range counts {
		l := lags[p]
		if l.End != int64(n) || l.Committed != int64(n) || l.Lag != 0 {
			t.Errorf("partition %d: %+v, want committed = end = %d, lag 0", p, l, n)
		}
	}
	h.mu.Lock()
	for p, order := range h.order {
		if !slices.IsSorted(order) {
			t.Errorf("partition %d handled out of offset order: %v", p, order)
		}
	}
	h.mu.Unlock()
	if d := h.duplicates(); d != 0 {
		t.Errorf("%d duplicate deliveries with one member and no failures", d)
	}

	commitMu.Lock()
	defer commitMu.Unlock()
	for p, n := range counts {
		cs := commits[p]
		if !slices.IsSorted(cs) || len(cs) == 0 || cs[len(cs)-1] != int64(n) {
			t.Errorf("partition %d: OnCommit offsets %v, want increasing up to %d", p, cs, n)
		}
	}
	if total := h.count(); commitFetched != total {
		t.Errorf("OnCommit reported %d fetch times, want one per handled record (%d)", commitFetched, total)
	}
	if commitUntimed > 0 {
		t.Errorf("OnCommit reported %d records without a record timestamp or fetch time", commitUntimed)
	}
}

// TestJoined: Joined is false before Run, true while in a generation and
// false once Run has returned.
func TestJoined(t *testing.T) {
	env := newKafkaEnv(t, 3)
	r := startConsumer(t, env.config(t), func(context.Context, kafka.Message) error { return nil })
	poll.Until(t, waitLong, "Joined()", r.Joined)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if r.Joined() {
		t.Error("Joined() after Run returned")
	}
}

// TestAbandonedMessageIsNotCommittedAndRedelivered: a handler error while
// the consumer is live abandons the record: its partition's commit stops at
// it while the other partitions progress; a new consumer of the group gets
// it again, and only the records not yet committed.
func TestAbandonedMessageIsNotCommittedAndRedelivered(t *testing.T) {
	env := newKafkaEnv(t, 3)
	env.produce(t, map[int]int{0: 10, 1: 10, 2: 10})
	const badPartition, badOffset = 1, 4

	var failures atomic.Int32
	log1 := testLogger(t)
	cfg := env.config(t)
	cfg.Logger = log1.Logger
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		if msg.Partition == badPartition && msg.Offset == badOffset {
			failures.Add(1)
			return errors.New("handler gave up")
		}
		return nil
	})
	poll.Until(t, waitLong, "the failing record handled", func() bool { return failures.Load() > 0 })
	// More records for the other partitions after the failure: they must
	// still be consumed.
	env.produce(t, map[int]int{0: 10, 2: 10})
	poll.Until(t, waitLong, "partitions 0 and 2 committed to the end, partition 1 up to the failing record", func() bool {
		lags := env.lags(t)
		if c := lags[badPartition].Committed; c > badOffset {
			t.Fatalf("partition %d committed %d, past the abandoned record %d", badPartition, c, badOffset)
		}
		return lags[0].Committed == 20 && lags[2].Committed == 20 && lags[badPartition].Committed == badOffset
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("the failing record was handed to the handler %d times, in %d generations, while the consumer ran",
		failures.Load(), log1.count("partitions assigned"))
	if c := env.lags(t)[badPartition].Committed; c != badOffset {
		t.Fatalf("after shutdown partition %d committed %d, want %d (the abandoned record)", badPartition, c, badOffset)
	}

	second := newHandled()
	r2 := startConsumer(t, env.config(t), func(ctx context.Context, msg kafka.Message) error {
		second.add(msg)
		return nil
	})
	poll.Until(t, waitLong, "the group committed to the end", func() bool { return committedAtEnd(env.lags(t)) })
	if err := r2.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	second.mu.Lock()
	defer second.mu.Unlock()
	want := map[int][]int64{badPartition: {4, 5, 6, 7, 8, 9}}
	if len(second.order) != 1 || !slices.Equal(second.order[badPartition], want[badPartition]) {
		t.Errorf("restarted consumer handled %v, want exactly %v (the abandoned record and the rest of its partition)", second.order, want)
	}
}

// TestRebalanceSkipsNothing: a second member joins the group mid-stream.
// Every record is handled at least once, no partition is ever handled by
// both members at the same time, and the commits reach the end.
func TestRebalanceSkipsNothing(t *testing.T) {
	env := newKafkaEnv(t, 3)

	// A continuous producer, so the second member certainly joins while
	// records are still arriving.
	stopProducing := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		w := env.writer()
		defer w.Close()
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				produced <- nil
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := w.WriteMessages(ctx,
				kafka.Message{Key: partitionKey(0, i)}, kafka.Message{Key: partitionKey(1, i)}, kafka.Message{Key: partitionKey(2, i)})
			cancel()
			if err != nil {
				produced <- err
				return
			}
			time.Sleep(10 * time.Millisecond) // pacing of the producer, not a wait for a condition
		}
	}()
	var stopOnce sync.Once
	var produceErr error
	stopProducer := func() error {
		stopOnce.Do(func() {
			close(stopProducing)
			select {
			case produceErr = <-produced:
			case <-time.After(waitLong):
				produceErr = errors.New("producer did not stop")
			}
		})
		return produceErr
	}
	t.Cleanup(func() { _ = stopProducer() })

	all := newHandled()
	var inFlight [3]atomic.Int32
	var overlaps atomic.Int32
	handler := func(name string, mine *atomic.Int32) Handler {
		return func(ctx context.Context, msg kafka.Message) error {
			if inFlight[msg.Partition].Add(1) > 1 {
				overlaps.Add(1)
				t.Logf("partition %d offset %d: %s handles it while the other member handles the same partition", msg.Partition, msg.Offset, name)
			}
			defer inFlight[msg.Partition].Add(-1)
			time.Sleep(2 * time.Millisecond) // some work, so a rebalance finds records in flight
			all.add(msg)
			mine.Add(1)
			return nil
		}
	}
	var byA, byB atomic.Int32
	logA, logB := testLogger(t), testLogger(t)
	cfgA, cfgB := env.config(t), env.config(t)
	cfgA.Logger, cfgB.Logger = logA.Logger, logB.Logger
	a := startConsumer(t, cfgA, handler("member A", &byA))
	poll.Until(t, waitLong, "member A to handle 30 records", func() bool { return byA.Load() >= 30 })

	b := startConsumer(t, cfgB, handler("member B", &byB))
	poll.Until(t, waitLong, "member B to handle 30 records", func() bool { return byB.Load() >= 30 })
	aAfterJoin := byA.Load()
	poll.Until(t, waitLong, "member A to keep going after the rebalance", func() bool { return byA.Load() >= aAfterJoin+10 })
	if err := stopProducer(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	lags := env.lags(t)
	end := map[int]int64{}
	for p, l := range lags {
		end[p] = l.End
	}
	poll.Until(t, waitLong, "every record handled and committed", func() bool {
		return all.covers(end) && committedAtEnd(env.lags(t))
	})
	if err := a.stop(t); err != nil {
		t.Errorf("member A: Run = %v", err)
	}
	if err := b.stop(t); err != nil {
		t.Errorf("member B: Run = %v", err)
	}
	if m := all.missing(end); len(m) > 0 {
		t.Errorf("records never handled: %v", m)
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d records handled while the other member was handling the same partition", n)
	}
	if l := env.lags(t); !committedAtEnd(l) {
		t.Errorf("after both members stopped: %+v, want committed = end everywhere", l)
	}
	t.Logf("log-end offsets %v; member A handled %d, member B %d; %d duplicate deliveries; generations seen: A %d, B %d",
		end, byA.Load(), byB.Load(), all.duplicates(), logA.count("partitions assigned"), logB.count("partitions assigned"))
}

// TestCommitIntervalCommitsIdlePartition: with CommitInterval set, records
// handled just before a partition goes quiet are still committed within
// about an interval, not only when the next record arrives or at shutdown.
func TestCommitIntervalCommitsIdlePartition(t *testing.T) {
	env := newKafkaEnv(t, 3)
	counts := map[int]int{0: 20}
	env.produce(t, counts)

	const interval = 200 * time.Millisecond
	cfg := env.config(t)
	cfg.CommitInterval = interval
	h := newHandled()
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		h.add(msg)
		return nil
	})
	poll.Until(t, waitLong, "every record handled", func() bool { return h.covers(ends(counts)) })
	poll.Until(t, 25*interval, "the last record committed while the partition is idle", func() bool {
		return env.lags(t)[0].Committed == 20
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// Validate names each wrong field as the struct does, so that cmd can
// report it under the variable that sets it, and checks the fields as
// given: a zero that New would default is refused.
func TestValidateNamesTheFields(t *testing.T) {
	cfg := Config{Topic: "t", MaxRecordBytes: 1 << 20, MaxInFlightBytes: 1 << 10,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 12 * time.Second, HeartbeatInterval: 2 * time.Second}
	var got []string
	for _, fe := range field.Errors(cfg.Validate()) {
		got = append(got, fe.Error())
	}
	want := []string{"Brokers: required", "GroupID: required",
		fmt.Sprintf("MaxInFlightBytes: 1024 cannot hold one maximal record: MaxRecordBytes (1048576) plus %d bytes of overhead", RecordOverhead),
		"HeartbeatInterval: must be positive and below a third of SessionTimeout (6s), got 2s",
		"DrainTimeout: must be positive and below SessionTimeout (6s) and RebalanceTimeout (12s), got 0s"}
	if !slices.Equal(got, want) {
		t.Errorf("Validate() fields:\n got %q\nwant %q", got, want)
	}
	valid := Config{Brokers: []string{"b:1"}, Topic: "t", GroupID: "g"}.withDefaults()
	if err := valid.Validate(); err != nil {
		t.Errorf("Validate(defaults) = %v", err)
	}
}
