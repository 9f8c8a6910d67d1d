package consumer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// healGate is a Gate a test raises and lowers by hand: while up, records
// at or past target[partition] are held; start rewinds every partition to
// rewind (when set) at the start of each generation.
type healGate struct {
	mu      sync.Mutex
	up      bool
	target  map[int]int64
	rewind  map[int]int64
	changed chan struct{}
	held    map[int64]bool // offsets Hold answered true for
	starts  []string       // "partition:committed" per Start call
}

func newHealGate() *healGate {
	return &healGate{target: map[int]int64{}, rewind: map[int]int64{}, changed: make(chan struct{}), held: map[int64]bool{}}
}

// Look finds nothing: the test's gate is set by hand.
func (g *healGate) Look(context.Context) error { return nil }

func (g *healGate) Start(partition int, committed int64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.starts = append(g.starts, fmt.Sprintf("%d:%d", partition, committed))
	if r, ok := g.rewind[partition]; ok && r < committed {
		return r
	}
	return committed
}

func (g *healGate) Hold(partition int, offset int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.up && offset >= g.target[partition] {
		g.held[offset] = true
		return true
	}
	return false
}

func (g *healGate) Changed() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// set raises or lowers the gate and tells the held partitions.
func (g *healGate) set(up bool, target map[int]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.up, g.target = up, target
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *healGate) wasHeld(offset int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held[offset]
}

// Hold holds every record at or past the target and none below it, even
// one that its key frees after a newer record of another key is held
// (offset 1 waits behind 0, under key A, while 2, key B, is held): kept
// in offset order, the ready records never strand 1 behind 2. Changed
// releases the rest.
func TestGateHoldsAndChangedReleases(t *testing.T) {
	env := newKafkaEnv(t, 1)
	w := env.writer()
	defer w.Close()
	keys := []string{"0/A", "0/A", "0/B", "0/B", "0/C"}
	msgs := make([]kafka.Message, len(keys))
	for i, k := range keys {
		msgs[i] = kafka.Message{Key: []byte(k), Value: []byte("v")}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	gate := newHealGate()
	gate.set(true, map[int]int64{0: 2})
	h := newHandled()
	cfg := env.config(t)
	cfg.Gate = gate
	startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		if msg.Offset == 0 {
			// Finish only once 2 is held, so that 1 is freed after it.
			poll.Until(t, waitLong, "offset 2 held", func() bool { return gate.wasHeld(2) })
		}
		h.add(msg)
		return nil
	})
	poll.Until(t, 20*time.Second, "offsets 0 and 1 handled below the target", func() bool {
		return h.covers(map[int]int64{0: 2})
	})
	time.Sleep(time.Second) // no event to poll for: the absence of handling
	if n := h.count(); n != 2 {
		t.Fatalf("%d records handled while the gate held offsets 2 and on; want 2", n)
	}
	gate.set(false, nil)
	poll.Until(t, waitLong, "everything handled once the gate is down", func() bool { return h.covers(map[int]int64{0: 5}) })
	poll.Until(t, waitLong, "committed to the end", func() bool { return committedAtEnd(env.lags(t)) })
}

// Start rewinds: a generation starts where the Gate says, below the
// group's committed offset, and the records from there are delivered
// again; the rewound commit keeps the frontier and Since of the
// commit before it.
func TestGateStartRewinds(t *testing.T) {
	env := newKafkaEnv(t, 1)
	env.produce(t, map[int]int{0: 10})
	h := newHandled()
	handle := func(_ context.Context, msg kafka.Message) error { h.add(msg); return nil }
	cfg := env.config(t)
	r := startConsumer(t, cfg, handle)
	poll.Until(t, waitLong, "committed to the end", func() bool { return committedAtEnd(env.lags(t)) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	before := readMark(t, env, 0)

	gate := newHealGate()
	gate.rewind[0] = 4
	cfg.Gate = gate
	startConsumer(t, cfg, handle)
	poll.Until(t, waitLong, "offsets 4..9 delivered again", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for o := int64(4); o < 10; o++ {
			if h.counts[0][o] != 2 {
				return false
			}
		}
		return true
	})
	poll.Until(t, waitLong, "committed to the end again", func() bool { return committedAtEnd(env.lags(t)) })
	for o := int64(0); o < 4; o++ {
		if n := h.countOf(0, o); n != 1 {
			t.Errorf("offset %d handled %d times; want once (below the rewind)", o, n)
		}
	}
	after := readMark(t, env, 0)
	if after.Mark.Since != before.Mark.Since || after.Mark.Frontier < before.Mark.Frontier {
		t.Errorf("mark %v after the rewound generation, %v before; want Since kept and Frontier not lower", after.Mark, before.Mark)
	}
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if len(gate.starts) == 0 || gate.starts[0] != "0:10" {
		t.Errorf("Start calls %v; want the first with the committed offset 10", gate.starts)
	}
}

// countOf is how many times offset of partition was handled.
func (h *handled) countOf(partition int, offset int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[partition][offset]
}

func readMark(t *testing.T, env *kafkaEnv, partition int) kafkagroup.Committed {
	t.Helper()
	got, err := kafkagroup.CommittedMarks(context.Background(), env.client, env.group, env.topic, []int{partition})
	if err != nil {
		t.Fatal(err)
	}
	if !got[partition].Marked {
		t.Fatalf("partition %d: commit %+v not marked", partition, got[partition])
	}
	return got[partition]
}

// Abandon cancels a handler blocked in flight before it returns, the
// generation ends, and the record comes back in the next generation; the
// records that finished before are committed and not delivered again.
func TestAbandonCancelsInFlightAndRedelivers(t *testing.T) {
	env := newKafkaEnv(t, 1)
	env.produce(t, map[int]int{0: 5})
	h := newHandled()
	blocked := make(chan context.Context, 1)
	var mu sync.Mutex
	attempts := 0
	cfg := env.config(t)
	cfg.CommitInterval = 50 * time.Millisecond
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		if msg.Offset == 2 {
			mu.Lock()
			attempts++
			first := attempts == 1
			mu.Unlock()
			if first {
				blocked <- ctx
				<-ctx.Done() // held in flight until abandoned
				return ctx.Err()
			}
		}
		h.add(msg)
		return nil
	})
	var inFlight context.Context
	select {
	case inFlight = <-blocked:
	case <-time.After(waitLong):
		t.Fatal("offset 2 never started")
	}
	g, _ := r.Generation()
	r.Abandon()
	if inFlight.Err() == nil {
		t.Fatal("Abandon returned with the in-flight handler's context alive")
	}
	poll.Until(t, waitLong, "everything handled in a later generation", func() bool { return h.covers(map[int]int64{0: 5}) })
	poll.Until(t, waitLong, "committed to the end", func() bool { return committedAtEnd(env.lags(t)) })
	if g2, ok := r.Generation(); !ok || g2.ID == g.ID {
		t.Errorf("generation %+v after Abandon, %+v before; want a new one", g2, g)
	}
	for o := int64(0); o < 2; o++ {
		if n := h.countOf(0, o); n != 1 {
			t.Errorf("offset %d handled %d times; want once (it finished before the abandon)", o, n)
		}
	}
}
