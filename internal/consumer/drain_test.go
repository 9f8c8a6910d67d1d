package consumer

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
	"github.com/segmentio/kafka-go"
)

// TestShutdownDrainsInFlightMessage: on cancellation an in-flight handler
// that finishes within DrainTimeout keeps its context and its offset is
// committed.
func TestShutdownDrainsInFlightMessage(t *testing.T) {
	env := newKafkaEnv(t, 3)
	env.produce(t, map[int]int{0: 2})

	started := make(chan struct{})
	var startOnce sync.Once
	var result atomic.Value
	r := startConsumer(t, env.config(t), func(ctx context.Context, msg kafka.Message) error {
		if msg.Offset == 0 {
			return nil
		}
		startOnce.Do(func() { close(started) })
		select {
		case <-time.After(500 * time.Millisecond):
			result.Store("finished")
			return nil
		case <-ctx.Done():
			result.Store("cancelled: " + ctx.Err().Error())
			return ctx.Err()
		}
	})
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatal("the slow record was never handled")
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := result.Load(); got != "finished" {
		t.Fatalf("in-flight handler: %v, want finished (500ms is within DrainTimeout %v)", got, testDrainTimeout)
	}
	if l := env.lags(t)[0]; l.Committed != 2 || l.Lag != 0 {
		t.Errorf("partition 0: %+v, want the drained record committed (committed 2, lag 0)", l)
	}
}

// TestShutdownAbandonsHandlerSlowerThanDrainTimeout: an in-flight handler
// still running DrainTimeout after cancellation has its context cancelled,
// and its record is not committed.
func TestShutdownAbandonsHandlerSlowerThanDrainTimeout(t *testing.T) {
	env := newKafkaEnv(t, 3)
	env.produce(t, map[int]int{0: 2})

	const drain = time.Second
	cfg := env.config(t)
	cfg.DrainTimeout = drain
	started := make(chan struct{})
	var startOnce sync.Once
	cancelled := make(chan time.Time, 1)
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		if msg.Offset == 0 {
			return nil
		}
		startOnce.Do(func() { close(started) })
		select {
		case <-time.After(waitLong):
			return nil
		case <-ctx.Done():
			select {
			case cancelled <- time.Now():
			default:
			}
			return ctx.Err()
		}
	})
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatal("the slow record was never handled")
	}
	stopAt := time.Now()
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	select {
	case at := <-cancelled:
		if grace := at.Sub(stopAt); grace < drain {
			t.Errorf("the handler's context ended %v after shutdown began, before DrainTimeout %v", grace, drain)
		}
	default:
		t.Fatal("Run returned but the slow handler's context was never cancelled")
	}
	if l := env.lags(t)[0]; l.Committed != 1 || l.Lag != 1 {
		t.Errorf("partition 0: %+v, want committed 1 (offset 0 done, offset 1 abandoned), lag 1", l)
	}
}

// TestRebalanceDrainsInFlightMessage: when a second member joins while the
// first is handling a record, the first finishes it within DrainTimeout and
// commits it before giving the partition up, so it is not handled again.
func TestRebalanceDrainsInFlightMessage(t *testing.T) {
	env := newKafkaEnv(t, 3)
	counts := map[int]int{0: 2, 1: 1, 2: 1}
	env.produce(t, counts)

	// The slow record outlasts a heartbeat interval after the second
	// member joins, so the first learns of the rebalance while it is still
	// in flight.
	const slow = 2500 * time.Millisecond
	cfg := env.config(t)
	cfg.DrainTimeout = 4 * time.Second // below the session timeout: kafka-go stops heartbeating while draining
	all := newHandled()
	started := make(chan struct{})
	var startOnce sync.Once
	var result atomic.Value
	var finishedAt atomic.Int64
	handle := func(ctx context.Context, msg kafka.Message) error {
		if msg.Partition == 0 && msg.Offset == 0 {
			startOnce.Do(func() { close(started) })
			select {
			case <-time.After(slow):
				finishedAt.Store(time.Now().UnixNano())
				result.Store("finished")
			case <-ctx.Done():
				result.Store("cancelled: " + ctx.Err().Error())
				return ctx.Err()
			}
		}
		all.add(msg)
		return nil
	}
	a := startConsumer(t, cfg, handle)
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatal("the slow record was never handled")
	}
	bStarted := time.Now()
	b := startConsumer(t, cfg, handle)
	poll.Until(t, waitLong, "every record handled and committed", func() bool {
		return all.covers(ends(counts)) && committedAtEnd(env.lags(t))
	})
	poll.Until(t, waitLong, "member B to join", b.Joined)
	if err := a.stop(t); err != nil {
		t.Errorf("member A: Run = %v", err)
	}
	if err := b.stop(t); err != nil {
		t.Errorf("member B: Run = %v", err)
	}
	if got := result.Load(); got != "finished" {
		t.Fatalf("in-flight handler: %v, want finished", got)
	}
	all.mu.Lock()
	n := all.counts[0][0]
	all.mu.Unlock()
	if n != 1 {
		t.Errorf("the record in flight during the rebalance was handled %d times, want once (drained and committed before the revoke)", n)
	}
	t.Logf("the slow record finished %v after member B started; %d duplicate deliveries",
		time.Duration(finishedAt.Load()-bStarted.UnixNano()).Round(time.Millisecond), all.duplicates())
}

// TestDrainLongerThanSessionTimeoutIsRejected: during a rebalance kafka-go
// stops heartbeating, so a drain longer than the session timeout would lose
// the membership and fail its commit (ILLEGAL_GENERATION). New refuses such
// a configuration instead of letting the drain be wasted.
func TestDrainLongerThanSessionTimeoutIsRejected(t *testing.T) {
	cfg := Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g", Logger: testLogger(t).Logger,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 20 * time.Second, DrainTimeout: 15 * time.Second,
		HeartbeatInterval: time.Second}
	if _, err := New(cfg, func(context.Context, kafka.Message) error { return nil }); err == nil {
		t.Fatal("New accepted a drain timeout longer than the session timeout")
	}
	cfg.DrainTimeout = 5 * time.Second
	if _, err := New(cfg, func(context.Context, kafka.Message) error { return nil }); err != nil {
		t.Fatalf("New rejected a drain within the session timeout: %v", err)
	}
}

// TestHeartbeatOfAThirdOfTheSessionIsRejected: one late heartbeat must not
// cost the membership, so New wants at least three per session; kafka-go's
// default (3s) is too slow for a 6s session.
func TestHeartbeatOfAThirdOfTheSessionIsRejected(t *testing.T) {
	cfg := Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g", Logger: testLogger(t).Logger,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 12 * time.Second, DrainTimeout: 3 * time.Second}
	for _, hb := range []time.Duration{0, 2 * time.Second, -time.Second} {
		cfg.HeartbeatInterval = hb
		if _, err := New(cfg, func(context.Context, kafka.Message) error { return nil }); err == nil {
			t.Errorf("New accepted heartbeat interval %v with a 6s session", hb)
		}
	}
	cfg.HeartbeatInterval = 1999 * time.Millisecond
	if _, err := New(cfg, func(context.Context, kafka.Message) error { return nil }); err != nil {
		t.Errorf("New rejected heartbeat interval 1.999s with a 6s session: %v", err)
	}
}

// TestShutdownStartsNoNewMessages: once Run's context is cancelled, the
// in-flight records finish but no further record is handed to the handler,
// although each partition has a backlog.
func TestShutdownStartsNoNewMessages(t *testing.T) {
	env := newKafkaEnv(t, 3)
	env.produce(t, map[int]int{0: 10, 1: 10, 2: 10})

	release := make(chan struct{})
	var inFlight sync.WaitGroup
	inFlight.Add(3)
	var stopping atomic.Bool
	var startedAfterStop atomic.Int32
	r := startConsumer(t, env.config(t), func(ctx context.Context, msg kafka.Message) error {
		if stopping.Load() {
			startedAfterStop.Add(1)
			t.Logf("partition %d offset %d handed to the handler after shutdown began", msg.Partition, msg.Offset)
		}
		if msg.Offset == 0 {
			inFlight.Done()
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	inFlightDone := make(chan struct{})
	go func() { inFlight.Wait(); close(inFlightDone) }()
	select {
	case <-inFlightDone:
	case <-time.After(waitLong):
		t.Fatal("not every partition's first record reached the handler")
	}
	stopping.Store(true)
	r.cancel()
	close(release)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if n := startedAfterStop.Load(); n > 0 {
		t.Errorf("%d records were started after shutdown began", n)
	}
	for p, l := range env.lags(t) {
		if l.Committed != 1 {
			t.Errorf("partition %d: %+v, want committed 1 (the drained record only)", p, l)
		}
	}
}

// TestShutdownLeavesWithoutPhantomGeneration: when one of two members shuts
// down, the other's next generation owns every partition. A departing
// member must leave the group, not rejoin it and be assigned partitions it
// will never consume.
func TestShutdownLeavesWithoutPhantomGeneration(t *testing.T) {
	env := newKafkaEnv(t, 3)
	logA, logB := testLogger(t), testLogger(t)
	cfgA, cfgB := env.config(t), env.config(t)
	cfgA.Logger, cfgB.Logger = logA.Logger, logB.Logger
	nop := func(context.Context, kafka.Message) error { return nil }
	a := startConsumer(t, cfgA, nop)
	poll.Until(t, waitLong, "member A to join", a.Joined)
	b := startConsumer(t, cfgB, nop)
	// Both are members once B holds fewer than all partitions.
	poll.Until(t, waitLong, "a generation shared by A and B", func() bool {
		as := assignments(logB.String())
		return b.Joined() && len(as) > 0 && len(as[len(as)-1]) < 3
	})
	before := len(assignments(logB.String()))
	if err := a.stop(t); err != nil {
		t.Fatalf("member A: Run = %v", err)
	}
	if strings.Contains(logA.String(), "leaving consumer group timed out") {
		t.Errorf("member A did not leave the group within CommitTimeout")
	}
	poll.Until(t, waitLong, "member B's next generation", func() bool { return len(assignments(logB.String())) > before })
	as := assignments(logB.String())
	if next := as[before]; len(next) != 3 {
		t.Errorf("member B's first generation after A stopped has partitions %v, want all 3 (generations of B: %v)", next, as)
	}
}

// assignments extracts, in order, the partitions of each "partitions
// assigned" log line.
func assignments(log string) [][]string {
	var out [][]string
	for line := range strings.Lines(log) {
		if !strings.Contains(line, `msg="partitions assigned"`) {
			continue
		}
		_, after, _ := strings.Cut(line, "partitions=")
		after = strings.Trim(strings.TrimSpace(after), `"[]`)
		out = append(out, strings.Fields(after))
	}
	return out
}
