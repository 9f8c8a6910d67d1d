package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// The loss the watch loop looks for — a marked commit that reaches Kafka
// after the new server's first connection ran its check — must not be
// erased by the next generation's first commit, which writes Kafka's
// committed offset as the position (committer.begin): the generation asks
// the heal to Look first. Found by the heal's second review; before the
// fix: "no gate, and offsets [3 4 5 6 7] ... never delivered again".
// The replica whose late commit it is rejoins right after it landed:
// Drop (its first new connection) ends its generation, the final flush
// waits on the in-flight commit (sending), and kafka-go's new generation
// fetches that commit. Here: the new server kept position 3, its first
// connection's check saw Kafka at 3 (no loss), the late marked commit of
// 8 lands, the replica's new generation begins; the watch then finds
// position 8 = commit 8, no loss, and the records 3..7 whose decisions
// the database lost are never delivered again.
func TestLateMarkedCommitIsNotErasedByTheNextGeneration(t *testing.T) {
	env := newKafkaEnv(t, 1)
	env.produce(t, map[int]int{0: 10})
	db := &failoverDB{pos: map[int]int64{0: 3}, server: "standby"}
	db.healer = heal.New(heal.Config{Group: env.group, Topic: env.topic, Client: env.client,
		Reader: kafkagroup.ReaderConfig{Brokers: env.brokers, Topic: env.topic}, Replica: "review2",
		Logger: testLogger(t).Logger})
	db.healer.SetStore(db) // as run's: the generation's Look reads the pool
	commit := func(offset int64) {
		t.Helper()
		res, err := env.client.OffsetCommit(context.Background(), &kafka.OffsetCommitRequest{GroupID: env.group, GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{env.topic: {{Partition: 0, Offset: offset,
				Metadata: kafkagroup.Mark{Frontier: 10, Since: 0}.String()}}}})
		if err != nil || res.Topics[env.topic][0].Error != nil {
			t.Fatalf("commit: %v %v", err, res)
		}
	}
	commit(3) // before the failover: position 3 and its commit, in step
	ctx := context.Background()
	// The promoted standby's first connection: its check reads Kafka at 3.
	if err := db.healer.Check(ctx, db, "standby"); err != nil || db.healer.Up() {
		t.Fatalf("check: %v, up %v; want no loss yet", err, db.healer.Up())
	}
	// The dying primary had acknowledged position 8; its OffsetCommit lands now.
	commit(8)
	// The replica that sent it rejoins (Drop ended its generation).
	h := newHandled()
	cfg := env.config(t)
	cfg.CommitInterval = 50 * time.Millisecond
	cfg.Positions, cfg.Gate = db, db.healer
	startConsumer(t, cfg, func(_ context.Context, msg kafka.Message) error { h.add(msg); return nil })
	poll.Until(t, waitLong, "offsets 8, 9 handled", func() bool { return h.countOf(0, 8) > 0 && h.countOf(0, 9) > 0 })
	// The watch loop's passes.
	for range 3 {
		if err := db.healer.Watch(ctx, db); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	db.mu.Lock()
	t.Logf("positions writes: %v, gate %v", db.written, db.gate)
	db.mu.Unlock()
	var never []int64
	for o := int64(3); o < 8; o++ {
		if h.countOf(0, o) == 0 {
			never = append(never, o)
		}
	}
	if !db.healer.Up() && len(never) > 0 {
		t.Errorf("no gate, and offsets %v (their decisions lost, Kafka committed past them) never delivered again: "+
			"the generation's first commit wrote position 8 before any watch pass compared it with Kafka", never)
	}
}
