package consumer

// The consumer's in-memory finished prefix must not outlive a database
// failover (issue 30 item 2; found by the heal's adversarial review): a
// new server makes the replica drop it (Drop, through the heal's
// OnNewServer).

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// failoverDB is the database as the heal and the positions see it: an
// in-memory heal.Store (the gate, forward-only positions) and a
// consumer.Positions that fails while the primary is down and, on the
// first write after the promotion, runs the heal's check first, as the
// pool's AfterConnect does on the new connection that write needs.
type failoverDB struct {
	mu        sync.Mutex
	pos       map[int]int64
	gate      map[int]heal.Range
	down      bool
	reconnect bool
	server    string // the server a new connection reaches (its identity)
	healer    *heal.Healer
	written   []map[int]int64 // every successful positions write, in order
	installs  int
}

func (d *failoverDB) installed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.installs > 0
}

func (d *failoverDB) Gate(context.Context) (map[int]heal.Range, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gate == nil {
		return nil, nil
	}
	return maps.Clone(d.gate), nil
}

func (d *failoverDB) Positions(context.Context) (map[int]int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.pos), nil
}

func (d *failoverDB) Install(_ context.Context, ranges map[int]heal.Range, _ []heal.Suspect, _ string, _ heal.Window) (map[int]heal.Range, int, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gate != nil {
		return maps.Clone(d.gate), 0, false, nil
	}
	d.gate = maps.Clone(ranges)
	d.installs++
	return ranges, 0, true, nil
}

func (d *failoverDB) Lift(context.Context) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, r := range d.gate {
		if p, ok := d.pos[id]; !ok || p < r.Hi {
			return false, nil
		}
	}
	d.gate = nil
	return true, nil
}

func (d *failoverDB) Advance(ctx context.Context, _, _ string, offsets map[int]int64) error {
	d.mu.Lock()
	if d.down {
		d.mu.Unlock()
		return errors.New("primary unreachable")
	}
	check, server := d.reconnect, d.server
	d.reconnect = false
	d.mu.Unlock()
	if check { // the new connection's AfterConnect, before the write uses it
		if err := d.healer.Check(ctx, d, server); err != nil {
			d.mu.Lock()
			d.reconnect = true
			d.mu.Unlock()
			return err
		}
	}
	if err := ctx.Err(); err != nil { // as pgx: a statement on an ended context is not sent
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, o := range offsets {
		d.pos[id] = max(d.pos[id], o)
	}
	d.written = append(d.written, maps.Clone(offsets))
	return nil
}

// A failover onto a standby that lost the position of a marked commit
// (Kafka committed 5, the standby kept position 0) and the decisions of
// offsets 0..9. The replica survives the failover: its committer still
// holds offsets 5..9 as finished (decided on the old primary; their
// decisions are gone). The first positions write after the promotion
// opens a new connection to a new server: its check drops that progress
// (the write fails) and installs the gate [0, 10). Every record of the
// range must be decided again before the gate lifts. Before the fix the
// write went on, recorded position 10 for decisions the database no
// longer had, and the watch lifted the gate at once: "the gate lifted
// with offsets [0 ... 9] of its range [0, 10) not decided again", and
// "offset 5 handled 1 time(s) ... never decided again" (5 to 9).
func TestNewServerDropsTheFinishedPrefixBeforeTheGateLifts(t *testing.T) {
	reviewStaleFinishedPrefix(t, false)
}

// The same with the watch loop's pass landing before the abandoned
// generation's partitions are assigned again (a rebalance of several
// members takes longer than the watch's second): before the fix the gate
// was down when Gate.Start was asked, nothing was rewound, and offsets
// 5..9 were never decided again.
func TestNewServerDropsTheFinishedPrefixSoItIsDecidedAgain(t *testing.T) {
	reviewStaleFinishedPrefix(t, true)
}

func reviewStaleFinishedPrefix(t *testing.T, watchFirst bool) {
	env := newKafkaEnv(t, 1)
	env.produce(t, map[int]int{0: 10})
	db := &failoverDB{pos: map[int]int64{}, server: "primary", reconnect: true}
	var c *Consumer
	h := newHandled()
	release := make(chan struct{})
	var againAtUp map[int64]int // handled counts when the gate went up
	db.healer = heal.New(heal.Config{Group: env.group, Topic: env.topic, Client: env.client,
		Reader: kafkagroup.ReaderConfig{Brokers: env.brokers, Topic: env.topic}, Replica: "review",
		Logger: testLogger(t).Logger, OnNewServer: func() { c.Drop() },
		OnUp: func() {
			h.mu.Lock()
			againAtUp = maps.Clone(h.counts[0])
			h.mu.Unlock()
			c.Abandon()
		}})
	cfg := env.config(t)
	cfg.CommitInterval = 50 * time.Millisecond
	cfg.Positions, cfg.Gate = db, db.healer
	r := startConsumer(t, cfg, func(_ context.Context, msg kafka.Message) error {
		if msg.Offset == 5 {
			<-release
		}
		h.add(msg)
		return nil
	})
	c = r.Consumer

	// 0..4 decided and committed (positions 5, Kafka 5, marked).
	poll.Until(t, waitLong, "offset 5 committed", func() bool { return env.lags(t)[0].Committed == 5 })
	// The primary dies: 5..9 are decided on it (then lost), their commit fails.
	db.mu.Lock()
	db.down = true
	db.mu.Unlock()
	close(release)
	poll.Until(t, waitLong, "offsets 5..9 handled", func() bool { return h.covers(map[int]int64{0: 10}) })
	time.Sleep(200 * time.Millisecond) // a few failing commit ticks
	// The standby is promoted: it kept position 0 (the writes of 1..5 were lost).
	db.mu.Lock()
	db.pos[0], db.down, db.reconnect, db.server = 0, false, true, "standby"
	db.mu.Unlock()

	if watchFirst {
		// The watch loop's pass right after the gate went up, before
		// kafka-go has the partition assigned again.
		go func() {
			for !db.healer.Up() {
				time.Sleep(time.Millisecond)
			}
			_ = db.healer.Watch(context.Background(), db)
		}()
	}
	poll.Until(t, waitLong, "the gate installed", db.installed)
	// The service's watch loop (every second there).
	lifted := false
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !lifted {
		if err := db.healer.Watch(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		lifted = !db.healer.Up()
		time.Sleep(100 * time.Millisecond)
	}
	h.mu.Lock()
	atLift := maps.Clone(h.counts[0])
	h.mu.Unlock()
	db.mu.Lock()
	written := db.written
	db.mu.Unlock()
	t.Logf("positions writes: %v", written)
	if lifted {
		var notRedecided []int64
		for o := int64(0); o < 10; o++ {
			if atLift[o] <= againAtUp[o] {
				notRedecided = append(notRedecided, o)
			}
		}
		if len(notRedecided) > 0 {
			t.Errorf("the gate lifted with offsets %v of its range [0, 10) not decided again since it went up "+
				"(the position reached Hi through the surviving replica's stale finished prefix)", notRedecided)
		}
	}
	// Whatever the lift did: are 5..9 ever decided again?
	time.Sleep(8 * time.Second)
	for o := int64(5); o < 10; o++ {
		if n := h.countOf(0, o); n < 2 {
			t.Errorf("offset %d handled %d time(s): its decision was lost in the failover and it was never decided again", o, n)
		}
	}
}
