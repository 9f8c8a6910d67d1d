package consumer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// failNth is a Positions whose fail-th Advance call fails (1-based) and
// whose others succeed.
type failNth struct {
	mu    sync.Mutex
	calls int
	fail  int
}

func (f *failNth) Advance(context.Context, string, string, map[int]int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls == f.fail {
		return errors.New("database blip")
	}
	return nil
}

func (f *failNth) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// In the sequential mode (CommitInterval 0) a partition flushes after each
// record, and nothing else flushes until the generation ends. A position
// write that fails once, for the last record of a burst, then leaves that
// record's offset uncommitted for as long as the partition stays idle and
// the generation lives: design.md's "the next flush tries both again"
// never comes, the lag stays 1, and BillingConsumerStalled (critical) would
// page after 15 minutes for a database blip of one statement. The interval
// mode retries on the next tick (TestFailedPositionsWriteStopsTheCommit).
func TestSequentialModeRetriesAFailedPositionsWriteWhileIdle(t *testing.T) {
	env := newKafkaEnv(t, 1)
	env.produce(t, map[int]int{0: 3})
	// The third record's write fails: the first write is the generation's
	// first commit's (every partition at its start offset).
	port := &failNth{fail: 4}
	cfg := env.config(t)
	cfg.CommitInterval = 0
	cfg.Concurrency = 1
	cfg.Positions = port
	h := newHandled()
	startConsumer(t, cfg, func(_ context.Context, msg kafka.Message) error {
		h.add(msg)
		return nil
	})
	poll.Until(t, waitLong, "every record handled", func() bool { return h.covers(ends(map[int]int{0: 3})) })
	poll.Until(t, waitLong, "the fourth position write (the failing one)", func() bool { return port.count() >= 4 })
	// Ten seconds idle: ten interval ticks of the default mode.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if env.lags(t)[0].Committed == 3 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	l := env.lags(t)[0]
	t.Fatalf("partition 0 idle for 10s after a failed position write: committed %d, lag %d, %d position writes; "+
		"want the commit retried (committed 3)", l.Committed, l.Lag, port.count())
}

// The final commit of a revoke (now a position write and the Kafka commit)
// runs after the drain, while kafka-go sends no heartbeat: DrainTimeout's
// doc says "the drain and the final commit must fit in SessionTimeout", and
// design.md that sharing CommitTimeout keeps "the drain's bound (below the
// session timeout) unchanged". With the service's defaults (session 6s,
// drain 3s, heartbeat 500ms; CommitTimeout left at its 10s default, which
// cmd/billing-consumer never sets) the final flush may take 10s of the 2.5s
// left: a position write slower than that costs the membership, and the
// Kafka commit after it is refused (the position is written, the records
// are redelivered). Validate should refuse such a budget, or the final
// flush be bounded by what is left of the session.
func TestFinalCommitBudgetFitsTheSessionLeftAfterTheDrain(t *testing.T) {
	cfg := Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g", Logger: testLogger(t).Logger,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 12 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		DrainTimeout: 3 * time.Second, Positions: &failNth{}}
	c, err := New(cfg, func(context.Context, kafka.Message) error { return nil })
	if err != nil {
		return // refused: fine
	}
	left := c.cfg.SessionTimeout - c.cfg.DrainTimeout - c.cfg.HeartbeatInterval
	if c.cfg.CommitTimeout > left {
		t.Fatalf("New accepted CommitTimeout %v for the final positions write and commit, with %v of the session left after the drain",
			c.cfg.CommitTimeout, left)
	}
}
