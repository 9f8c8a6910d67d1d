package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/logtest"
)

// Group timings that keep rebalances quick: the broker's minimum session
// timeout, and a drain well below both session and rebalance timeouts
// (kafka-go stops heartbeating while a generation drains).
const (
	testSessionTimeout    = 6 * time.Second
	testRebalanceTimeout  = 10 * time.Second
	testHeartbeatInterval = time.Second
	testDrainTimeout      = 2 * time.Second
	testCommitTimeout     = 5 * time.Second

	// waitLong bounds a wait that includes joining a group; the first join
	// of kafka-go's ConsumerGroup can take a few seconds.
	waitLong = 60 * time.Second
)

// kafkaEnv is a topic (3 partitions unless asked otherwise) and a group
// name on the broker under test, with a client for GroupLag.
type kafkaEnv struct {
	brokers []string
	topic   string
	group   string
	client  *kafka.Client
}

func newKafkaEnv(t *testing.T, partitions int) *kafkaEnv {
	t.Helper()
	brokers := kafkatest.Brokers(t)
	env := &kafkaEnv{
		brokers: brokers,
		topic:   kafkatest.UniqueName("consumer-test"),
		group:   kafkatest.UniqueName("consumer-test-group"),
		client:  &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}},
	}
	kafkatest.CreateTopic(t, brokers, env.topic, partitions)
	return env
}

// config is a Config for env with quick group timings and a logger whose
// output is shown only when the test fails.
func (env *kafkaEnv) config(t *testing.T) Config {
	t.Helper()
	return Config{
		Brokers:           env.brokers,
		Topic:             env.topic,
		GroupID:           env.group,
		DrainTimeout:      testDrainTimeout,
		CommitTimeout:     testCommitTimeout,
		SessionTimeout:    testSessionTimeout,
		RebalanceTimeout:  testRebalanceTimeout,
		HeartbeatInterval: testHeartbeatInterval,
		// One slot per partition: each partition runs in offset order and
		// none waits for another's slow handler.
		Concurrency: 3,
		Logger:      testLogger(t).Logger,
	}
}

// partitionKey makes a record key that partitionBalancer sends to
// partition p.
// All records of a partition share that key, so the consumer handles them
// one at a time in offset order, as the tests of ordering expect; i is
// ignored.
func partitionKey(p, i int) []byte { return fmt.Appendf(nil, "%d/order", p) }

// partitionBalancer routes a record to the partition named by its key
// prefix, so tests know exactly which offsets each partition gets.
var partitionBalancer = kafka.BalancerFunc(func(msg kafka.Message, partitions ...int) int {
	p, err := strconv.Atoi(strings.SplitN(string(msg.Key), "/", 2)[0])
	if err != nil {
		panic("test record key without a partition prefix: " + string(msg.Key))
	}
	return p
})

func (env *kafkaEnv) writer() *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(env.brokers...),
		Topic:        env.topic,
		Balancer:     partitionBalancer,
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		// Its own transport: kafka-go's shared default one caches metadata
		// for seconds, and may not know a topic created a moment ago.
		Transport: &kafka.Transport{},
	}
}

// produce writes counts[p] records to each partition p, acknowledged by all
// in-sync replicas. Offsets of a fresh topic start at 0, so partition p then
// ends at counts[p].
func (env *kafkaEnv) produce(t *testing.T, counts map[int]int) {
	t.Helper()
	w := env.writer()
	defer w.Close()
	var msgs []kafka.Message
	for p, n := range counts {
		for i := range n {
			msgs = append(msgs, kafka.Message{Key: partitionKey(p, i), Value: []byte("v")})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s: %v", env.topic, err)
	}
}

// lags is GroupLag by partition.
func (env *kafkaEnv) lags(t *testing.T) map[int]PartitionLag {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ls, err := GroupLag(ctx, env.client, env.topic, env.group)
	if err != nil {
		t.Fatalf("GroupLag: %v", err)
	}
	out := make(map[int]PartitionLag, len(ls))
	for _, l := range ls {
		out[l.Partition] = l
	}
	return out
}

// committedAtEnd reports whether the group has committed the log-end offset
// of every partition.
func committedAtEnd(lags map[int]PartitionLag) bool {
	for _, l := range lags {
		if l.Committed != l.End || l.Lag != 0 {
			return false
		}
	}
	return len(lags) > 0
}

// running is a Consumer whose Run executes in a goroutine owned by the test.
type running struct {
	*Consumer
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startConsumer runs a Consumer for cfg and handle until stop or the end of
// the test.
func startConsumer(t *testing.T, cfg Config, handle Handler) *running {
	t.Helper()
	c, err := New(cfg, handle)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Consumer: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(waitLong):
			t.Errorf("Run did not return within %v of the end of the test", waitLong)
		}
	})
	return r
}

// stop cancels Run's context and returns Run's result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(waitLong):
		t.Fatalf("Run did not return within %v of cancellation", waitLong)
		return nil
	}
}

// handled records which messages a handler finished, per partition and
// offset, across consumers.
type handled struct {
	mu     sync.Mutex
	counts map[int]map[int64]int
	order  map[int][]int64
	total  int
}

func newHandled() *handled {
	return &handled{counts: map[int]map[int64]int{}, order: map[int][]int64{}}
}

func (h *handled) add(msg kafka.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts[msg.Partition] == nil {
		h.counts[msg.Partition] = map[int64]int{}
	}
	h.counts[msg.Partition][msg.Offset]++
	h.order[msg.Partition] = append(h.order[msg.Partition], msg.Offset)
	h.total++
}

func (h *handled) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total
}

// covers reports whether every offset in [0, end[p]) of every partition was
// handled at least once.
func (h *handled) covers(end map[int]int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, e := range end {
		for o := range e {
			if h.counts[p][o] == 0 {
				return false
			}
		}
	}
	return true
}

// missing lists, per partition, offsets below end that were never handled.
func (h *handled) missing(end map[int]int64) map[int][]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int][]int64{}
	for p, e := range end {
		for o := range e {
			if h.counts[p][o] == 0 {
				out[p] = append(out[p], o)
			}
		}
	}
	return out
}

// duplicates is the number of extra deliveries beyond the first.
func (h *handled) duplicates() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, offs := range h.counts {
		for _, c := range offs {
			n += c - 1
		}
	}
	return n
}

func ends(counts map[int]int) map[int]int64 {
	out := make(map[int]int64, len(counts))
	for p, n := range counts {
		out[p] = int64(n)
	}
	return out
}

// logBuffer collects a consumer's log; it is printed only if the test
// fails, and it stays writable after the test ends (kafka-go goroutines may
// log late).
type logBuffer struct {
	logtest.Buffer
	*slog.Logger
}

// count returns the number of log lines containing s.
func (b *logBuffer) count(s string) int { return strings.Count(b.String(), s) }

func testLogger(t *testing.T) *logBuffer {
	t.Helper()
	b := &logBuffer{}
	b.Logger = slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() && b.String() != "" {
			t.Logf("consumer log:\n%s", b.String())
		}
	})
	return b
}
