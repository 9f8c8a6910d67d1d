package heal_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// Adversarial review (issue 30 item 2). design.md "The heal", "When it
// runs": "On every new database connection of run's pool ... and on each
// replica's watch loop (every second). It reads the gate first; if none is
// up, Kafka's committed offsets and marks, then the database's positions".
// Watch reads only the gate: a loss that becomes visible after the
// connections were made and checked — a marked commit that reaches Kafka
// after the promoted standby's connections ran their check (its position
// write was acknowledged by the old primary just before it died, the
// OffsetCommit was slower than the promotion) — is never seen while the
// pool makes no new connection.
func TestReviewHealWatchFindsALossTheConnectionsMissed(t *testing.T) {
	ev := func() uuid.UUID { return uuid.Must(uuid.NewV7()) }
	w := newWorld(t, []rec{{0, 1, ev()}, {0, 2, ev()}, {0, 3, ev()}, {0, 4, ev()}})
	ctx := context.Background()
	if err := (&postgres.Positions{Pool: w.db}).Advance(ctx, w.group, w.topic, map[int]int64{0: 1}); err != nil {
		t.Fatal(err)
	}
	w.commit(t, map[int]int64{0: 1}, map[int]kafkagroup.Mark{0: {Frontier: 10, Since: 0}})
	ups, blocked := 0, 0
	h, pool := w.healer(t, &ups, &blocked)
	if err := pool.Ping(ctx); err != nil { // the promoted standby's first connection: in step
		t.Fatal(err)
	}
	if h.Up() {
		t.Fatal("up before any loss")
	}
	// The late OffsetCommit lands: Kafka 3 (marked), the database kept 1.
	w.commit(t, map[int]int64{0: 3}, map[int]kafkagroup.Mark{0: {Frontier: 10, Since: 0}})
	for range 3 { // three watch passes
		if err := h.Watch(ctx, postgres.HealStore{DB: pool, Group: w.group, Topic: w.topic}); err != nil {
			t.Fatal(err)
		}
	}
	if !h.Up() {
		t.Errorf("a marked commit at 3 over position 1, three watch passes later: the gate is not up " +
			"(Watch never compares Kafka's commits with the positions; only a new connection does)")
	}
}

// Liveness (review): with Kafka unreachable, no new database connection
// of run's pool can be made at all — the check runs before any use and
// fails — so the completer, the deferred decisions, the pause and heal
// watches, the schema guard's heartbeat and /readyz's database checks
// all fail once their connections are recycled, though none of them needs
// Kafka. This test reports how long one attempt takes and what it says.
func TestReviewHealConnectWithKafkaDown(t *testing.T) {
	w := newWorld(t, nil)
	w.client = &kafka.Client{Addr: kafka.TCP("127.0.0.1:1"), Timeout: 10 * time.Second}
	ups, blocked := 0, 0
	_, pool := w.healer(t, &ups, &blocked)
	start := time.Now()
	err := pool.Ping(context.Background())
	t.Logf("Ping with Kafka down: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("no database connection while Kafka is down: %v", err)
	}
}
