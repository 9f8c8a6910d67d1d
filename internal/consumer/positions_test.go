package consumer

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// positionsPort is a Positions that fails while failing is set and keeps
// the offsets of its successful writes.
type positionsPort struct {
	mu       sync.Mutex
	failing  bool
	failures int
	written  map[int]int64
}

func (p *positionsPort) Advance(_ context.Context, group, topic string, offsets map[int]int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failing {
		p.failures++
		return errors.New("database unreachable")
	}
	for id, o := range offsets {
		p.written[id] = max(p.written[id], o)
	}
	return nil
}

func (p *positionsPort) state() (failures int, written map[int]int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failures, maps.Clone(p.written)
}

func (p *positionsPort) setFailing(f bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failing = f
}

// A position write that fails stops the Kafka commit it precedes: while
// the port fails, the finished records stay uncommitted (every commit
// tick tries again, and each failure is counted); once it works, the next
// commit writes the positions and then commits, and the positions equal
// the committed offsets. The port works at first: the generation's first
// commit (every partition at its start, 0) needs its positions written
// before anything is dispatched (TestFirstCommitWaitsForThePositions).
func TestFailedPositionsWriteStopsTheCommit(t *testing.T) {
	env := newKafkaEnv(t, 3)
	port := &positionsPort{written: map[int]int64{}}
	var counted atomic.Int64
	cfg := env.config(t)
	cfg.CommitInterval = 50 * time.Millisecond
	cfg.Positions = port
	cfg.OnPositionsFailed = func() { counted.Add(1) }
	h := newHandled()
	r := startConsumer(t, cfg, func(_ context.Context, msg kafka.Message) error {
		h.add(msg)
		return nil
	})
	poll.Until(t, waitLong, "the generation's first commit", func() bool {
		_, written := port.state()
		return len(written) == 3 && committedAtEnd(env.lags(t))
	})
	port.setFailing(true)
	env.produce(t, map[int]int{0: 3, 1: 2})
	want := ends(map[int]int{0: 3, 1: 2, 2: 0})
	poll.Until(t, waitLong, "every record handled", func() bool { return h.covers(want) })
	poll.Until(t, waitLong, "several failed position writes after the records finished, or a commit", func() bool {
		n, _ := port.state()
		return n >= 5 || env.lags(t)[0].Committed > 0
	})
	for p, l := range env.lags(t) {
		if l.Committed > 0 {
			t.Fatalf("partition %d committed %d while the positions could not be written; want no commit", p, l.Committed)
		}
	}
	if n := counted.Load(); n < 5 {
		t.Errorf("OnPositionsFailed called %d times, want one per failed write (at least 5)", n)
	}

	port.setFailing(false)
	poll.Until(t, waitLong, "the offsets committed once the positions are written", func() bool {
		return env.lags(t)[0].Committed == 3 && env.lags(t)[1].Committed == 2
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if _, written := port.state(); !maps.Equal(written, want) {
		t.Errorf("positions written %v, want the committed offsets %v", written, want)
	}
}
