package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// churnLog checks, across every member of a group, the promises a Consumer
// makes while members come and go: a committed offset covers only messages
// whose handler returned nil, a partition's committed offset never moves
// backwards, no message below a committed offset is started again, two
// messages of one key never run at once, and OnCommit calls never overlap
// within one consumer.
type churnLog struct {
	t  *testing.T
	mu sync.Mutex
	// finished[p][o]: a handler of partition p, offset o returned nil.
	finished map[int]map[int64]bool
	// committed[p]: the highest offset any member's OnCommit reported.
	committed map[int]int64
	keyBusy   map[string]bool
	problems  []string
}

func newChurnLog(t *testing.T) *churnLog {
	return &churnLog{t: t, finished: map[int]map[int64]bool{}, committed: map[int]int64{}, keyBusy: map[string]bool{}}
}

func (l *churnLog) problem(format string, args ...any) {
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
}

// handler is a member's Handler: it takes a random few milliseconds, fails
// transiently now and then (retried in place), and honours ctx.
func (l *churnLog) handler(name string, count *atomic.Int64) Handler {
	return func(ctx context.Context, msg kafka.Message) error {
		k := fmt.Sprintf("%d/%s", msg.Partition, msg.Key)
		l.mu.Lock()
		if l.keyBusy[k] {
			l.problem("%s: key %s offset %d started while another message of the key runs", name, k, msg.Offset)
		}
		if c, ok := l.committed[msg.Partition]; ok && msg.Offset < c {
			l.problem("%s: partition %d offset %d started after offset %d was committed", name, msg.Partition, msg.Offset, c)
		}
		l.keyBusy[k] = true
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			l.keyBusy[k] = false
			l.mu.Unlock()
		}()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(rand.IntN(4)) * time.Millisecond):
		}
		if rand.IntN(40) == 0 {
			return errors.New("transient failure before the partition stopped")
		}
		l.mu.Lock()
		if l.finished[msg.Partition] == nil {
			l.finished[msg.Partition] = map[int64]bool{}
		}
		l.finished[msg.Partition][msg.Offset] = true
		l.mu.Unlock()
		count.Add(1)
		return nil
	}
}

// onCommit is a member's OnCommit.
func (l *churnLog) onCommit(name string) func(int, int64, []Timing) {
	var calls atomic.Int32
	return func(p int, next int64, _ []Timing) {
		if calls.Add(1) > 1 {
			l.mu.Lock()
			l.problem("%s: OnCommit called concurrently", name)
			l.mu.Unlock()
		}
		defer calls.Add(-1)
		l.mu.Lock()
		defer l.mu.Unlock()
		if c, ok := l.committed[p]; ok && next < c {
			l.problem("%s: partition %d committed %d after %d was committed", name, p, next, c)
		}
		for o := l.committed[p]; o < next; o++ {
			if !l.finished[p][o] {
				l.problem("%s: partition %d committed %d but offset %d never finished", name, p, next, o)
				break
			}
		}
		l.committed[p] = max(l.committed[p], next)
	}
}

func (l *churnLog) check() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, p := range l.problems {
		if i == 20 {
			l.t.Errorf("... and %d more", len(l.problems)-i)
			break
		}
		l.t.Error(p)
	}
}

// TestCommitsOnlyFinishedMessagesWhileMembersComeAndGo: three members join
// and leave a group one after the other while records arrive on four keys
// per partition, with fewer workers than partitions (so partitions compete
// for workers while others drain), handlers that sometimes fail and are
// retried in place, and both the interval and the per-message commit. No
// member commits an unfinished message, moves an offset backwards, starts a
// message below a committed offset, runs two messages of a key at once, or
// calls OnCommit concurrently; everything is finally committed.
func TestCommitsOnlyFinishedMessagesWhileMembersComeAndGo(t *testing.T) {
	for _, interval := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run(fmt.Sprintf("interval %v", interval), func(t *testing.T) {
			churn(t, interval)
		})
	}
}

func churn(t *testing.T, interval time.Duration) {
	env := newKafkaEnv(t, 3)
	l := newChurnLog(t)
	produce := func(n int) {
		w := env.writer()
		defer w.Close()
		var msgs []kafka.Message
		for i := range n {
			p := i % 3
			msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "%d/k%d", p, (i/3)%4), Value: []byte("v")})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	start := func(name string, count *atomic.Int64) *running {
		cfg := env.config(t)
		cfg.Concurrency = 2
		cfg.CommitInterval = interval
		cfg.MaxRecordBytes, cfg.MaxInFlightBytes = 1024, 3*64*(RecordOverhead+8)
		cfg.OnCommit = l.onCommit(name)
		return startConsumer(t, cfg, l.handler(name, count))
	}
	var nA, nB, nC atomic.Int64
	produce(600)
	a := start("A", &nA)
	poll.Until(t, waitLong, "A to handle 100 records", func() bool { return nA.Load() >= 100 })
	produce(600)
	b := start("B", &nB)
	poll.Until(t, waitLong, "B to handle 50 records", func() bool { return nB.Load() >= 50 })
	produce(600)
	if err := a.stop(t); err != nil {
		t.Errorf("A: Run = %v", err)
	}
	c := start("C", &nC)
	poll.Until(t, waitLong, "C to handle 50 records", func() bool { return nC.Load() >= 50 })
	produce(600)
	poll.Until(t, waitLong, "everything committed", func() bool { return committedAtEnd(env.lags(t)) })
	for name, r := range map[string]*running{"B": b, "C": c} {
		if err := r.stop(t); err != nil {
			t.Errorf("%s: Run = %v", name, err)
		}
	}
	l.check()
	t.Logf("handled: A %d, B %d, C %d (2400 records)", nA.Load(), nB.Load(), nC.Load())
}

// TestRebalanceWhileOnePartitionHoldsEveryWorker: with one worker, held by
// a partition-0 handler that runs until its context ends, the other
// partitions' backlogs wait for it. A second member joining must not hang
// the rebalance: the held handler is cancelled after DrainTimeout and
// abandoned, the starved partitions drain at once (they started nothing),
// and the group goes on to handle and commit every record.
func TestRebalanceWhileOnePartitionHoldsEveryWorker(t *testing.T) {
	env := newKafkaEnv(t, 3)
	env.produce(t, map[int]int{0: 1})
	all := newHandled()
	var held atomic.Int32
	var heldCancelled atomic.Bool
	handle := func(ctx context.Context, msg kafka.Message) error {
		if msg.Partition == 0 && msg.Offset == 0 && held.Add(1) == 1 {
			<-ctx.Done()
			heldCancelled.Store(true)
			return ctx.Err()
		}
		all.add(msg)
		return nil
	}
	cfgA := env.config(t)
	cfgA.Concurrency = 1
	a := startConsumer(t, cfgA, handle)
	poll.Until(t, waitLong, "member A to hold its only worker", func() bool { return held.Load() == 1 })
	env.produce(t, map[int]int{1: 20, 2: 20})

	b := startConsumer(t, env.config(t), handle)
	end := map[int]int64{0: 1, 1: 20, 2: 20}
	poll.Until(t, waitLong, "every record handled and committed", func() bool {
		return all.covers(end) && committedAtEnd(env.lags(t))
	})
	if !heldCancelled.Load() {
		t.Error("the handler holding the worker was never cancelled, yet its record was handled again")
	}
	for name, r := range map[string]*running{"A": a, "B": b} {
		if err := r.stop(t); err != nil {
			t.Errorf("member %s: Run = %v", name, err)
		}
	}
	if m := all.missing(end); len(m) > 0 {
		t.Errorf("records never handled: %v", m)
	}
}
