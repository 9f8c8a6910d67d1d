package heal_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// Review finding 3 (issue 30 item 2): the watch loop looks for a loss too.
// Before the fix Watch read only the gate: a loss that becomes visible after the
// connections were made and checked — a marked commit that reaches Kafka
// after the promoted standby's connections ran their check (its position
// write was acknowledged by the old primary just before it died, the
// OffsetCommit was slower than the promotion) — is never seen while the
// pool makes no new connection.
func TestWatchFindsALossTheConnectionsMissed(t *testing.T) {
	ev := func() uuid.UUID { return uuid.Must(uuid.NewV7()) }
	w := newWorld(t, []rec{{0, 1, ev()}, {0, 2, ev()}, {0, 3, ev()}, {0, 4, ev()}})
	ctx := context.Background()
	if err := (&postgres.Positions{DB: postgres.FromPool(w.db)}).Advance(ctx, w.group, w.topic, map[int]int64{0: 1}); err != nil {
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

// Liveness (review finding 5): with Kafka unreachable, a new connection
// to the server this replica has already checked (a recycled one: pgx's
// lifetimes) needs no Kafka, so the completer, the watches, the schema
// guard and /readyz keep their database. A new server's first connection
// still does (its check reads the committed offsets). Before the fix no
// connection could be made at all while Kafka was down.
func TestCheckNeedsNoKafkaForARecycledConnection(t *testing.T) {
	w := newWorld(t, nil)
	kafkaDown := &atomic.Bool{}
	w.client = &kafka.Client{Addr: kafka.TCP(w.brokers...), Timeout: 10 * time.Second, Transport: failing{kafka.DefaultTransport, kafkaDown}}
	ups, blocked := 0, 0
	_, pool := w.healer(t, &ups, &blocked)
	ctx := context.Background()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	kafkaDown.Store(true)
	pool.Reset() // every connection closed: the next one is new
	start := time.Now()
	err := pool.Ping(ctx)
	t.Logf("Ping on a recycled connection with Kafka down: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("no database connection while Kafka is down: %v", err)
	}
}

// failing is a Kafka transport that fails every request while down is set.
type failing struct {
	kafka.RoundTripper
	down *atomic.Bool
}

func (f failing) RoundTrip(ctx context.Context, addr net.Addr, msg protocol.Message) (protocol.Message, error) {
	if f.down.Load() {
		return nil, errors.New("kafka down (test)")
	}
	return f.RoundTripper.RoundTrip(ctx, addr, msg)
}
