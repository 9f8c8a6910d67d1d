package heal

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// slowGate is a Store whose Gate answers nil (the snapshot taken before
// another path installed the gate) only once release is closed.
type slowGate struct {
	fakeStore
	asked   chan struct{}
	release chan struct{}
}

func (s *slowGate) Gate(context.Context) (map[int]Range, error) {
	close(s.asked)
	<-s.release
	return nil, nil
}

// Review 2: a Check whose read of the gate (or whose look) predates an
// install by another path (the watch loop's look, another connection's
// check) ends with set(nil): it lowers this replica's view of a gate
// that is up in the database, and look's doc says "none lowers this
// replica's view of the gate". While the view is down Hold lets records
// past Hi be decided and Start does not rewind the generation OnUp's
// Abandon just restarted, until the next watch pass raises it again.
func TestStaleCheckLowersAGateInstalledMeanwhile(t *testing.T) {
	ups := 0
	h := New(Config{Logger: quiet(), OnUp: func() { ups++ }})
	h.server, h.checked = "s1", true // a recycled connection to a checked server
	db := &fakeStore{}               // the database
	stale := &slowGate{asked: make(chan struct{}), release: make(chan struct{})}
	ctx := context.Background()

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := h.Check(ctx, stale, "s1"); err != nil {
			t.Error(err)
		}
	})
	<-stale.asked // its gate read is on the wire: none up yet
	// Meanwhile the watch loop (or another connection's look) installs a heal.
	db.gate = map[int]Range{0: {Lo: 100, Hi: 340, Committed: 300, Position: 100}}
	db.positions = map[int]int64{0: 100}
	if err := h.Watch(ctx, db); err != nil {
		t.Fatal(err)
	}
	if !h.Up() || ups != 1 {
		t.Fatalf("the watch saw the gate: Up %v, OnUp %d", h.Up(), ups)
	}
	close(stale.release)
	wg.Wait()
	time.Sleep(10 * time.Millisecond)
	if !h.Up() || !h.Hold(0, 340) || h.Start(0, 300) != 100 {
		t.Errorf("the database's gate is up, but after the stale check: Up %v, Hold(0, 340) %v, Start(0, 300) %d "+
			"(want true, true, 100): records past Hi are decided and the restarted generation is not rewound "+
			"until the next watch pass", h.Up(), h.Hold(0, 340), h.Start(0, 300))
	}
}

// Review 2: with the gate lifted in the database (another replica's
// watch saw every position reach its Hi), a replica whose view is up
// lowers it only after reading Kafka: Watch now goes through look, whose
// find fails first while Kafka is unreachable, so this replica keeps
// holding its consumer and skipping its completer and deferred-decision
// passes (Guard) for as long as Kafka is down, though nothing is healing.
// Before the review's fix Watch lowered the view on a nil gate at once.
func TestWatchKeepsALiftedGateUpWhileKafkaIsDown(t *testing.T) {
	h := New(Config{Logger: quiet(), Topic: "t", Group: "g",
		Client: &kafka.Client{Addr: kafka.TCP("127.0.0.1:1"), Timeout: 200 * time.Millisecond}})
	db := &fakeStore{gate: map[int]Range{0: {Lo: 1, Hi: 2}}, positions: map[int]int64{0: 1}}
	ctx := context.Background()
	if err := h.Watch(ctx, db); err != nil || !h.Up() {
		t.Fatalf("gate up: err %v, Up %v", err, h.Up())
	}
	db.gate = nil // lifted by another replica
	err := h.Watch(ctx, db)
	t.Logf("watch pass with the gate lifted and Kafka down: %v", err)
	if h.Up() {
		t.Error("the database's gate is down, but this replica still holds billing (Up true) because the pass read Kafka before lowering it")
	}
}
