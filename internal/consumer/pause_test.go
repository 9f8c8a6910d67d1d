package consumer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// testGate is a Config.Pause an operator opens and closes by hand.
type testGate struct {
	mu   sync.Mutex
	open chan struct{}
}

func newTestGate(open bool) *testGate {
	g := &testGate{open: make(chan struct{})}
	if open {
		close(g.open)
	}
	return g
}

func (g *testGate) get() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

func (g *testGate) set(open bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		if !open {
			g.open = make(chan struct{})
		}
	default:
		if open {
			close(g.open)
		}
	}
}

// A closed gate stops fetching while the consumer stays a group member
// with its partitions; a record already running when the gate closes
// finishes and is committed, and nothing after it starts until the gate
// opens again, when everything is consumed and committed to the end.
func TestGatePausesFetchingAndFinishesInFlight(t *testing.T) {
	env := newKafkaEnv(t, 1)
	counts := map[int]int{0: 10}
	env.produce(t, counts)
	gate := newTestGate(false)
	h := newHandled()
	release := make(chan struct{})
	started := make(chan struct{}, 16)
	cfg := env.config(t)
	cfg.Pause = gate.get
	cfg.CommitInterval = 0
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		started <- struct{}{}
		if msg.Offset == 3 {
			<-release // in flight when the pause begins
		}
		h.add(msg)
		return nil
	})
	poll.Until(t, waitLong, "the consumer owns its partition", func() bool {
		g, ok := r.Generation()
		return ok && g.Partitions == 1
	})
	// Paused from the start: a member with its partition, nothing handled.
	time.Sleep(2 * time.Second) // no event to poll for: the absence of handling
	if n := h.count(); n != 0 {
		t.Fatalf("%d records handled while the gate was closed from the start", n)
	}
	gate.set(true)
	for range 4 { // offsets 0..3; 3 blocks in the handler
		select {
		case <-started:
		case <-time.After(waitLong):
			t.Fatal("records not handled after the gate opened")
		}
	}
	gate.set(false)
	// The fetch loop holds back what it fetched meanwhile; then the
	// in-flight record finishes and is committed.
	time.Sleep(500 * time.Millisecond)
	before := h.count()
	close(release)
	poll.Until(t, waitLong, "the in-flight record committed", func() bool { return env.lags(t)[0].Committed >= 4 })
	time.Sleep(2 * time.Second) // again: nothing new may start while paused
	if n := h.count(); before != 3 || n != 4 {
		// Offsets 4.. were fetched and wait behind 3 (one key): a pause
		// starts none of them.
		t.Fatalf("%d records handled before the in-flight one finished, %d after; want 3, then 4", before, n)
	}
	if !r.Joined() {
		t.Fatal("the paused consumer left the group")
	}
	gate.set(true)
	poll.Until(t, waitLong, "everything handled after resume", func() bool { return h.covers(ends(counts)) })
	poll.Until(t, waitLong, "committed to the end", func() bool { return committedAtEnd(env.lags(t)) })
}
