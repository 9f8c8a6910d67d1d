package consumer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

func TestRaised(t *testing.T) {
	for _, c := range []struct {
		frontier, reach, window, want int64
		raise                         bool
	}{
		{frontier: 1000, reach: 100, window: 256, want: 1000},               // far below
		{frontier: 1000, reach: 872, window: 256, want: 1000},               // reach + w/2 == frontier: highest dispatched 871 + 128 < 1000
		{frontier: 1000, reach: 873, window: 256, want: 1129, raise: true},  // 872 + 128 >= 1000
		{frontier: 1000, reach: 1001, window: 512, want: 1513, raise: true}, // waiting at 1000
		{frontier: 0, reach: 0, window: 256, want: 256, raise: true},
	} {
		got, raise := raised(c.frontier, c.reach, c.window)
		if got != c.want || raise != c.raise {
			t.Errorf("raised(%d, %d, %d) = %d, %v; want %d, %v", c.frontier, c.reach, c.window, got, raise, c.want, c.raise)
		}
	}
	for delta, want := range map[int64]int64{0: minWindow, 100: minWindow, 1000: 2000, maxWindow: maxWindow} {
		if got := tickWindow(delta); got != want {
			t.Errorf("tickWindow(%d) = %d, want %d", delta, got, want)
		}
	}
}

func TestInsertReadyKeepsOffsetOrder(t *testing.T) {
	var ready fifo[kafka.Message]
	for _, off := range []int64{3, 7, 5, 9, 1, 8} {
		insertReady(&ready, kafka.Message{Offset: off})
	}
	got := make([]int64, 0, ready.Len())
	for _, m := range ready.Items() {
		got = append(got, m.Offset)
	}
	if want := []int64{1, 3, 5, 7, 8, 9}; !slices.Equal(got, want) {
		t.Fatalf("ready %v, want %v", got, want)
	}
}

// A flush that only raises a frontier re-commits the partition's last
// committed offset and writes no position; one with progress writes the
// position and carries Since unchanged; a failed request raises nothing.
func TestCommitterRaisesFrontiers(t *testing.T) {
	l := newCommitLog()
	cm := newCommitter(l.commit, l.done, testLogger(t).Logger)
	if err := cm.begin(map[int]startPoint{0: {offset: 10, frontier: 10 + minWindow, since: 4}}); err != nil {
		t.Fatal(err)
	}
	ln := cm.lane(0)
	if f := ln.frontier.Load(); f != 10+minWindow {
		t.Fatalf("frontier after begin %d, want %d", f, 10+minWindow)
	}
	ln.reach.Store(10 + minWindow/2 + 1) // dispatched up to 10+128: half the window
	l.failing = true
	cm.flush()
	if f := ln.frontier.Load(); f != 10+minWindow {
		t.Fatalf("a failed commit moved the frontier to %d", f)
	}
	l.failing = false
	cm.flush()
	last := l.marks[len(l.marks)-1][0]
	want := kafkagroup.MarkedOffset{Offset: 10, Mark: kafkagroup.Mark{Frontier: 10 + minWindow/2 + 1 + minWindow, Since: 4}}
	if last != want || len(l.positions[len(l.positions)-1]) != 0 {
		t.Fatalf("raise-only commit %+v writing positions %v; want %+v and no positions", last, l.positions[len(l.positions)-1], want)
	}
	if f := ln.frontier.Load(); f != want.Mark.Frontier {
		t.Fatalf("frontier %d after the raise, want %d", f, want.Mark.Frontier)
	}
	n := len(l.requests)
	cm.flush()
	if len(l.requests) != n {
		t.Fatalf("a flush with no progress and a frontier far enough sent %v", l.requests[n:])
	}
	cm.advance(0, 12, timings(10, 11))
	cm.flush()
	if got := l.marks[len(l.marks)-1][0]; got.Offset != 12 || got.Mark != want.Mark || l.positions[len(l.positions)-1][0] != 12 {
		t.Fatalf("progress commit %+v, positions %v; want offset 12 with the mark unchanged and position 12", got, l.positions[len(l.positions)-1])
	}
}

// markWatch reads the group's committed marks while a test runs and
// reports what breaks the marks' promises: every commit is marked, Since
// never changes, Frontier never moves down, and the position written
// before a commit is at least its offset.
type markWatch struct {
	env  *kafkaEnv
	port *positionsPort
	ids  []int

	mu        sync.Mutex
	problems  []string
	last      map[int]kafkagroup.Committed
	frontiers map[int]map[int64]bool // distinct frontiers seen
}

func watchMarks(t *testing.T, env *kafkaEnv, port *positionsPort, ids []int) *markWatch {
	w := &markWatch{env: env, port: port, ids: ids, last: map[int]kafkagroup.Committed{}, frontiers: map[int]map[int64]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w.check(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		for _, p := range w.problems {
			t.Error(p)
		}
	})
	return w
}

func (w *markWatch) check(ctx context.Context) {
	got, err := kafkagroup.CommittedMarks(ctx, w.env.client, w.env.group, w.env.topic, w.ids)
	if err != nil {
		return // the test is ending, or a broker hiccup: the next read
	}
	_, written := w.port.state()
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, c := range got {
		prev, seen := w.last[id]
		switch {
		case !c.Marked:
			w.problems = append(w.problems, fmt.Sprintf("partition %d: commit at %d without a mark", id, c.Offset))
		case written[id] < c.Offset:
			w.problems = append(w.problems, fmt.Sprintf("partition %d: commit at %d, position written %d", id, c.Offset, written[id]))
		case c.Mark.Frontier < c.Offset:
			w.problems = append(w.problems, fmt.Sprintf("partition %d: frontier %d below the commit %d", id, c.Mark.Frontier, c.Offset))
		case seen && c.Mark.Since != prev.Mark.Since:
			w.problems = append(w.problems, fmt.Sprintf("partition %d: since moved from %d to %d", id, prev.Mark.Since, c.Mark.Since))
		case seen && c.Mark.Frontier < prev.Mark.Frontier:
			w.problems = append(w.problems, fmt.Sprintf("partition %d: frontier moved down from %d to %d", id, prev.Mark.Frontier, c.Mark.Frontier))
		}
		if w.frontiers[id] == nil {
			w.frontiers[id] = map[int64]bool{}
		}
		w.frontiers[id][c.Mark.Frontier] = true
		w.last[id] = c
	}
}

// snapshot is the last marks read and how many distinct frontiers each
// partition showed.
func (w *markWatch) snapshot() (map[int]kafkagroup.Committed, map[int]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, n := map[int]kafkagroup.Committed{}, map[int]int{}
	for id, c := range w.last {
		last[id], n[id] = c, len(w.frontiers[id])
	}
	return last, n
}

// produceKeyed writes n records to partition p, each under its own key,
// so that the consumer may run them all at once.
func (env *kafkaEnv) produceKeyed(t *testing.T, p, n int) {
	t.Helper()
	w := env.writer()
	defer w.Close()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "%d/k%d", p, i), Value: []byte("v")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s: %v", env.topic, err)
	}
}

// Every commit is marked and its position written first; Since stays
// where the group's tracking began and Frontier never moves down, across
// commits and across generations and members; a record is never handed
// to the handler at or past the frontier of the last commit on the broker
// (the handler asks the broker itself); and a stream of keyed records
// runs through many windows without stalling, in the interval mode and
// the sequential one (counted in records, not time).
func TestMarksAndFrontierAcrossGenerations(t *testing.T) {
	for _, mode := range []struct {
		name        string
		interval    time.Duration
		concurrency int
		perRound    int
	}{
		{"interval", 50 * time.Millisecond, 16, 3000},
		{"sequential", 0, 1, 700},
	} {
		t.Run(mode.name, func(t *testing.T) {
			env := newKafkaEnv(t, 2)
			port := &positionsPort{written: map[int]int64{}}
			w := watchMarks(t, env, port, []int{0, 1})
			h := newHandled()
			var mu sync.Mutex
			var beyond []string
			handle := func(ctx context.Context, msg kafka.Message) error {
				got, err := kafkagroup.CommittedMarks(ctx, env.client, env.group, env.topic, []int{msg.Partition})
				if err != nil {
					return err // the consumer retries it
				}
				if c := got[msg.Partition]; !c.Marked || msg.Offset >= c.Mark.Frontier {
					mu.Lock()
					beyond = append(beyond, fmt.Sprintf("%d/%d handed out with the committed mark %+v", msg.Partition, msg.Offset, c))
					mu.Unlock()
				}
				h.add(msg)
				return nil
			}
			cfg := env.config(t)
			cfg.CommitInterval, cfg.Concurrency, cfg.Positions = mode.interval, mode.concurrency, port
			total := 0
			for round := range 2 { // a second member, a new generation
				r := startConsumer(t, cfg, handle)
				env.produceKeyed(t, 0, mode.perRound)
				env.produceKeyed(t, 1, mode.perRound/10)
				total += mode.perRound + mode.perRound/10
				want := map[int]int64{0: int64((round + 1) * mode.perRound), 1: int64((round + 1) * (mode.perRound / 10))}
				poll.Until(t, 2*waitLong, fmt.Sprintf("round %d: every record handled", round), func() bool { return h.covers(want) })
				poll.Until(t, waitLong, "committed to the end", func() bool { return committedAtEnd(env.lags(t)) })
				if err := r.stop(t); err != nil {
					t.Fatalf("Run = %v", err)
				}
			}
			w.check(context.Background())
			last, distinct := w.snapshot()
			if last[0].Mark.Since != 0 || last[1].Mark.Since != 0 {
				t.Errorf("since %d, %d; want 0 (the first commit's offset), carried", last[0].Mark.Since, last[1].Mark.Since)
			}
			if distinct[0] < 4 {
				t.Errorf("partition 0 showed %d distinct frontiers for %d records; want the stream through many windows", distinct[0], 2*mode.perRound)
			}
			if h.count() < total {
				t.Errorf("%d records handled, want %d", h.count(), total)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(beyond) > 0 {
				t.Errorf("%d records handed out at or past the committed frontier, first %v", len(beyond), beyond[:min(5, len(beyond))])
			}
		})
	}
}

// The generation's first commit needs its positions: while they cannot be
// written, nothing is committed and nothing dispatched (the heal reads a
// marked commit without a position row as a loss); once they can, the
// stream flows.
func TestFirstCommitWaitsForThePositions(t *testing.T) {
	env := newKafkaEnv(t, 1)
	env.produce(t, map[int]int{0: 5})
	port := &positionsPort{failing: true, written: map[int]int64{}}
	cfg := env.config(t)
	cfg.CommitInterval = 50 * time.Millisecond
	cfg.Positions = port
	h := newHandled()
	startConsumer(t, cfg, func(_ context.Context, msg kafka.Message) error {
		h.add(msg)
		return nil
	})
	poll.Until(t, waitLong, "three failed first commits", func() bool { n, _ := port.state(); return n >= 3 })
	if n := h.count(); n != 0 {
		t.Fatalf("%d records handled before the generation's first commit", n)
	}
	marks, err := kafkagroup.CommittedMarks(context.Background(), env.client, env.group, env.topic, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := marks[0]; ok {
		t.Fatalf("committed %+v while the positions could not be written", c)
	}
	port.setFailing(false)
	poll.Until(t, waitLong, "committed to the end", func() bool { return committedAtEnd(env.lags(t)) })
	if !h.covers(ends(map[int]int{0: 5})) {
		t.Fatalf("not every record handled: missing %v", h.missing(ends(map[int]int{0: 5})))
	}
}
