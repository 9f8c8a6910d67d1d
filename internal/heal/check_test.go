package heal_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/migrate"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// rec is one order.confirmed record for partition.
type rec struct {
	partition int
	order     int64
	event     uuid.UUID
}

func value(r rec) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"event_type":"order.confirmed.v1","occurred_at":"2026-11-29T12:00:00Z",`+
		`"order_id":%d,"customer_id":42,"total_amount":"99.90"}`, r.event.String(), r.order)
}

// world is a topic of two partitions with records, a group whose
// commits the test makes, and a database whose positions it writes.
type world struct {
	brokers      []string
	topic, group string
	client       *kafka.Client
	db           *pgxpool.Pool
	dbURL        string
}

func newWorld(t *testing.T, recs []rec) *world {
	t.Helper()
	w := &world{brokers: kafkatest.Brokers(t), topic: kafkatest.UniqueName("heal"), group: kafkatest.UniqueName("heal-g")}
	kafkatest.CreateTopic(t, w.brokers, w.topic, 2)
	w.client = &kafka.Client{Addr: kafka.TCP(w.brokers...), Timeout: 10 * time.Second}
	// A new topic may be unknown for a moment to the broker that answers
	// metadata or to the group coordinator (real Kafka).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ids, err := kafkagroup.Partitions(context.Background(), w.client, w.topic)
		if err == nil && len(ids) == 2 {
			if _, err = kafkagroup.CommittedMarks(context.Background(), w.client, w.group, w.topic, ids); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s not ready: %v", w.topic, err)
		}
	}
	wr := &kafka.Writer{Addr: kafka.TCP(w.brokers...), Topic: w.topic, Balancer: partitionOf{}, BatchSize: 1}
	defer wr.Close()
	for _, r := range recs {
		m := kafka.Message{Key: fmt.Append(nil, r.partition), Value: value(r)}
		if err := wr.WriteMessages(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	w.dbURL = pgtest.NewDatabase(t)
	w.db = pgtest.Open(t, w.dbURL)
	if _, err := migrate.Up(context.Background(), w.db, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	return w
}

// partitionOf writes each record to the partition its key names.
type partitionOf struct{}

func (partitionOf) Balance(m kafka.Message, _ ...int) int { return int(m.Key[0] - '0') }

// commit commits offsets with marks as a standalone client.
func (w *world) commit(t *testing.T, offsets map[int]int64, marks map[int]kafkagroup.Mark) {
	t.Helper()
	var commits []kafka.OffsetCommit
	for p, o := range offsets {
		c := kafka.OffsetCommit{Partition: p, Offset: o}
		if m, ok := marks[p]; ok {
			c.Metadata = m.String()
		}
		commits = append(commits, c)
	}
	// A new topic may be unknown to the group coordinator for a moment
	// (real Kafka: UNKNOWN_TOPIC_OR_PARTITION): retry that.
	var last error
	for range 50 {
		res, err := w.client.OffsetCommit(context.Background(), &kafka.OffsetCommitRequest{GroupID: w.group, GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{w.topic: commits}})
		if err != nil {
			t.Fatal(err)
		}
		last = nil
		for _, p := range res.Topics[w.topic] {
			if p.Error != nil {
				last = p.Error
			}
		}
		if !errors.Is(last, kafka.UnknownTopicOrPartition) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil {
		t.Fatal(last)
	}
}

// healer returns a Healer of w and a pool whose every new connection
// runs its check, as run's pool does.
func (w *world) healer(t *testing.T, ups *int, blocked *int) (*heal.Healer, *pgxpool.Pool) {
	t.Helper()
	h := heal.New(heal.Config{Group: w.group, Topic: w.topic, Client: w.client,
		Reader: kafkagroup.ReaderConfig{Brokers: w.brokers, Topic: w.topic}, Replica: "test",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnUp:   func() { *ups++ }, OnHeal: func(_ int64, b int) { *blocked += b }})
	pc, err := pgxpool.ParseConfig(w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.AfterConnect = postgres.HealOnConnect(h, w.group, w.topic)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return h, pool
}

// A database that lost a marked commit's position: the first connection
// installs the gate before it is used, with the ranges up to the
// frontiers, and blocks the order whose two events fell in the ranges;
// the order whose claim survived and the order with one event are not
// blocked. Records past the frontier are not read.
func TestCheckInstallsTheGateOnTheFirstConnection(t *testing.T) {
	ev := func() uuid.UUID { return uuid.Must(uuid.NewV7()) }
	recs := []rec{
		{0, 1, ev()}, {0, 2, ev()}, {0, 3, ev()}, {0, 4, ev()}, // p0 offsets 0..3
		{1, 2, ev()}, {1, 3, ev()}, {1, 5, ev()}, {1, 4, ev()}, // p1 offsets 0..3; order 4's second event is past the frontier
	}
	w := newWorld(t, recs)
	ctx := context.Background()
	if _, err := w.db.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, status, claim_token)
VALUES (3, $1, 42, 99.90, 'charged', gen_random_uuid())`, recs[2].event); err != nil {
		t.Fatal(err)
	}
	positions := &postgres.Positions{DB: postgres.FromPool(w.db)}
	// The database kept p0's position 1 and p1's 0; Kafka has p0 committed
	// at 3 (marked: lost), p1 at 1 with its frontier at 3.
	if err := positions.Advance(ctx, w.group, w.topic, map[int]int64{0: 1, 1: 0}); err != nil {
		t.Fatal(err)
	}
	w.commit(t, map[int]int64{0: 3, 1: 1}, map[int]kafkagroup.Mark{0: {Frontier: 10, Since: 0}, 1: {Frontier: 3, Since: 0}})

	ups, blocked := 0, 0
	h, pool := w.healer(t, &ups, &blocked)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if !h.Up() || ups != 1 {
		t.Fatalf("after the first connection: Up %v, OnUp %d times; want up, once", h.Up(), ups)
	}
	gate, err := postgres.HealStore{DB: w.db, Group: w.group, Topic: w.topic}.Gate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]heal.Range{0: {Lo: 1, Hi: 4, Committed: 3, Position: 1}, 1: {Lo: 0, Hi: 3, Committed: 1, Position: 0}}
	for id, r := range want {
		if gate[id] != r {
			t.Errorf("partition %d: range %+v, want %+v", id, gate[id], r)
		}
	}
	var orders []int64
	rows, _ := w.db.Query(ctx, `SELECT order_id FROM charge WHERE status = 'blocked' ORDER BY order_id`)
	for rows.Next() {
		var o int64
		_ = rows.Scan(&o)
		orders = append(orders, o)
	}
	if rows.Err() != nil || len(orders) != 1 || orders[0] != 2 || blocked != 1 {
		t.Fatalf("blocked orders %v (counted %d), want [2]: order 3's claim survived, order 4's second event is past p1's frontier, 1 and 5 have one event",
			orders, blocked)
	}
	if h.Start(0, 3) != 1 || h.Hold(0, 3) || !h.Hold(0, 4) || !h.Hold(1, 3) {
		t.Errorf("Start(0, 3) = %d, Hold(0,3) %v, Hold(0,4) %v, Hold(1,3) %v; want 1, false, true, true",
			h.Start(0, 3), h.Hold(0, 3), h.Hold(0, 4), h.Hold(1, 3))
	}
}

// Commits without the mark (an older release, Kafka's tools) are never a
// loss, whatever the positions say.
func TestCheckIgnoresUnmarkedCommits(t *testing.T) {
	w := newWorld(t, []rec{{0, 1, uuid.Must(uuid.NewV7())}, {0, 1, uuid.Must(uuid.NewV7())}})
	if err := (&postgres.Positions{DB: postgres.FromPool(w.db)}).Advance(context.Background(), w.group, w.topic, map[int]int64{0: 0}); err != nil {
		t.Fatal(err)
	}
	w.commit(t, map[int]int64{0: 2}, nil)
	ups, blocked := 0, 0
	h, pool := w.healer(t, &ups, &blocked)
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.Up() || ups != 0 || blocked != 0 {
		t.Fatalf("Up %v, OnUp %d, blocked %d; want no heal", h.Up(), ups, blocked)
	}
}
