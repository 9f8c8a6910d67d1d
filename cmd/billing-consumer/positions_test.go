package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The positions command refuses an incomplete or contradictory command
// line before it reaches Kafka or the database (none is reachable here);
// -h prints the usage and succeeds.
func TestPositionsCommandLines(t *testing.T) {
	setEnv(t, validEnv)
	for _, tc := range []struct {
		args []string
		want string // in the error; "" for success
	}{
		{[]string{"positions"}, "missing subcommand"},
		{[]string{"positions", "heal"}, `unknown subcommand "heal"`},
		{[]string{"positions", "accept"}, "--reason is required"},
		{[]string{"positions", "accept", "--reason", " "}, "--reason is required"},
		{[]string{"positions", "show", "--reason", "r"}, "for accept only"},
		{[]string{"positions", "show", "--partition", "-2"}, "--partition must be"},
		{[]string{"positions", "show", "extra"}, `unexpected argument "extra"`},
		{[]string{"positions", "--help"}, ""},
		{[]string{"positions", "accept", "-h"}, ""},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if tc.want == "" {
			if err != nil || !strings.Contains(stdout.String(), "Usage:") {
				t.Errorf("%q: %v, stdout %q; want the usage and success", tc.args, err, stdout.String())
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errUsage) {
			t.Errorf("%q: %v; want a usage error containing %q", tc.args, err, tc.want)
		}
		if stdout.Len() > 0 {
			t.Errorf("%q printed %q on stdout before failing", tc.args, stdout.String())
		}
	}
}

// positions show prints, per partition, Kafka's committed offset, the
// database's position and the gap; positions accept moves the positions
// forward to the committed offsets (only --partition's when given, never
// back) and audits each move.
func TestPositionsShowAndAccept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.UniqueName("cmd-positions"), kafkatest.UniqueName("cmd-positions-billing")
	kafkatest.CreateTopic(t, brokers, topic, 4)
	pool := pgtest.NewPool(t)
	setEnv(t, map[string]string{
		"BILLING_KAFKA_BROKERS":  strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":    topic,
		"BILLING_KAFKA_GROUP_ID": group,
		"BILLING_DATABASE_URL":   pool.Config().ConnString(),
	})
	// Kafka: partitions 0, 1, 2 committed at 10, 20, 7; 3 never committed.
	// The database: 0 behind at 5, 1 ahead at 25, 2 and 3 untracked.
	produceTo(t, ctx, brokers, topic, map[int]int{0: 10, 1: 20, 2: 7})
	commitOffsets(t, ctx, brokers, group, topic, map[int]int64{0: 10, 1: 20, 2: 7})
	pos := &postgres.Positions{DB: postgres.FromPool(pool)}
	if err := pos.Advance(ctx, group, topic, map[int]int64{0: 5, 1: 25}); err != nil {
		t.Fatal(err)
	}
	positions := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(ctx, append([]string{"positions"}, args...), &out, &errOut); err != nil {
			t.Fatalf("positions %q: %v\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	line := func(out string, p int) string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^` + string(rune('0'+p)) + ` .*$`).FindString(out)
		if m == "" {
			t.Fatalf("no line for partition %d in\n%s", p, out)
		}
		return strings.Join(strings.Fields(m), " ")
	}

	out := positions("show")
	for p, want := range map[int]string{
		0: "0 10 5 5 ", 1: "1 20 25 0 ", 2: "2 7 - - - untracked", 3: "3 - - - - untracked",
	} {
		if got := line(out, p); !strings.HasPrefix(got, want) {
			t.Errorf("show, partition %d: %q, want it to start with %q\n%s", p, got, want, out)
		}
	}
	if !strings.Contains(line(out, 0), "database behind Kafka") || !strings.Contains(out, "1 partition(s) where Kafka is ahead") {
		t.Errorf("show does not say partition 0 is behind:\n%s", out)
	}
	if strings.Contains(out, "writes no positions run") {
		t.Errorf("show names older replicas where none runs:\n%s", out)
	}
	// A replica of level 12 (writes no positions) heartbeating in the
	// group is named; one of another group, or stale, is not.
	if _, err := pool.Exec(ctx, `INSERT INTO billing_replica (replica_id, binary_level, version, consumer_group, heartbeat_at) VALUES
('old-a', 12, 'v12', $1, now()), ('old-b', 12, 'v12', 'other', now()), ('old-c', 12, 'v12', $1, now() - interval '5 minutes'),
('new-d', 13, 'v13', $1, now())`, group); err != nil {
		t.Fatal(err)
	}
	if out = positions("show"); !strings.Contains(out, "writes no positions run in this group: old-a (level 12, seen 0s ago);") {
		t.Errorf("show does not name the level-12 replica old-a (alone):\n%s", out)
	}

	// A dry run names what accept would move (0 behind, 2 untracked with a
	// committed offset; not 1, ahead, nor 3, never committed) and moves
	// nothing.
	out = positions("accept", "--dry-run", "--reason", "INC-7 check", "--operator", "ann")
	if !strings.Contains(out, "would move partition 0 from 5 to 10\n") || !strings.Contains(out, "would move partition 2 from - to 7\n") ||
		!strings.Contains(out, "would move 2 position(s)") || !strings.HasPrefix(line(out, 0), "0 10 5 5 ") {
		t.Errorf("accept --dry-run:\n%s", out)
	}
	out = positions("accept", "--partition", "0", "--reason", "INC-7 reset to latest", "--operator", "ann")
	if !strings.Contains(out, "moved 1 position(s)") || !strings.HasPrefix(line(out, 0), "0 10 10 0 ") ||
		!strings.Contains(line(out, 0), "in step") || strings.Contains(out, "\n2 ") {
		t.Errorf("accept --partition 0: want partition 0 moved and shown alone:\n%s", out)
	}
	if out = positions("show"); !strings.HasPrefix(line(out, 2), "2 7 - ") {
		t.Errorf("accept --partition 0 moved partition 2:\n%s", out)
	}
	out = positions("accept", "--reason", "INC-7 the rest", "--operator", "ann")
	if !strings.Contains(out, "moved 1 position(s)") || !strings.HasPrefix(line(out, 1), "1 20 25 ") ||
		!strings.HasPrefix(line(out, 2), "2 7 7 0 ") || !strings.HasPrefix(line(out, 3), "3 - - ") {
		t.Errorf("accept (every partition): want only partition 2 moved (1 is ahead, 3 has no committed offset):\n%s", out)
	}
	var audits int
	var reasons string
	if err := pool.QueryRow(ctx, `SELECT count(*), string_agg(partition || ':' || coalesce(before::text, 'none') || '->' || after || ' ' || operator || ' ' || reason, '; ' ORDER BY id)
FROM position_audit WHERE consumer_group = $1`, group).Scan(&audits, &reasons); err != nil {
		t.Fatal(err)
	}
	if want := "0:5->10 ann INC-7 reset to latest; 2:none->7 ann INC-7 the rest"; audits != 2 || reasons != want {
		t.Errorf("position_audit: %d rows %q, want %q", audits, reasons, want)
	}
}

func produceTo(t *testing.T, ctx context.Context, brokers []string, topic string, counts map[int]int) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		Transport: &kafka.Transport{}, Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return int(m.Key[0]) })}
	defer w.Close()
	var msgs []kafka.Message
	for p, n := range counts {
		for range n {
			msgs = append(msgs, kafka.Message{Key: []byte{byte(p)}, Value: []byte("v")})
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// commitOffsets commits offsets for group as a client outside the group
// (generation -1), as kafka-consumer-groups --reset-offsets does.
func commitOffsets(t *testing.T, ctx context.Context, brokers []string, group, topic string, offsets map[int]int64) {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Timeout: 15 * time.Second}
	var parts []kafka.OffsetCommit
	for p, o := range offsets {
		parts = append(parts, kafka.OffsetCommit{Partition: p, Offset: o})
	}
	res, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{topic: parts}})
	if err != nil {
		t.Fatalf("commit offsets: %v", err)
	}
	for _, ps := range res.Topics[topic] {
		if ps.Error != nil {
			t.Fatalf("commit offsets, partition %d: %v", ps.Partition, ps.Error)
		}
	}
}

// A gap behind a marked commit (this release's: a position write preceded
// it) is a loss, which the failover heal re-decides: show says so, accept
// leaves it, and while a heal's gate is up accept and the claim commands
// that settle an order refuse (the heal's review, finding 4).
func TestPositionsAcceptLeavesLossesAndWaitsForTheHeal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.UniqueName("cmd-heal"), kafkatest.UniqueName("cmd-heal-billing")
	kafkatest.CreateTopic(t, brokers, topic, 2)
	pool := pgtest.NewPool(t)
	setEnv(t, map[string]string{
		"BILLING_KAFKA_BROKERS":  strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":    topic,
		"BILLING_KAFKA_GROUP_ID": group,
		"BILLING_DATABASE_URL":   pool.Config().ConnString(),
	})
	produceTo(t, ctx, brokers, topic, map[int]int{0: 10, 1: 10})
	commitOffsets(t, ctx, brokers, group, topic, map[int]int64{0: 10})
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Timeout: 15 * time.Second}
	res, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{
		topic: {{Partition: 1, Offset: 10, Metadata: kafkagroup.Mark{Frontier: 12, Since: 0}.String()}}}})
	if err != nil || res.Topics[topic][0].Error != nil {
		t.Fatalf("marked commit: %v %+v", err, res)
	}
	if err := (&postgres.Positions{DB: postgres.FromPool(pool)}).Advance(ctx, group, topic, map[int]int64{0: 5, 1: 5}); err != nil {
		t.Fatal(err)
	}
	cmd := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(ctx, args, &out, &errOut)
		return out.String() + errOut.String(), err
	}
	out, err := cmd("positions", "show")
	if err != nil || !strings.Contains(out, "lost database commits (the failover heal re-decides them)") {
		t.Errorf("show: %v\n%s", err, out)
	}
	out, err = cmd("positions", "accept", "--dry-run", "--reason", "INC-9", "--operator", "ann")
	if err != nil || !strings.Contains(out, "would move partition 0 from 5 to 10") || !strings.Contains(out, "partition 1 is behind a commit of this release") {
		t.Errorf("accept --dry-run: %v\n%s", err, out)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO heal_range (consumer_group, topic, partition, lo, hi, committed, position, started_by)
VALUES ($1, $2, 1, 5, 12, 10, 5, 'test')`, group, topic); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"positions", "accept", "--reason", "INC-9", "--operator", "ann"},
		{"claim", "release", "--order", "1", "--reason", "INC-9", "--provider-holds-no-charge", "--operator", "ann"},
	} {
		if out, err := cmd(args...); err == nil || !strings.Contains(err.Error(), "a failover heal is in progress") {
			t.Errorf("%q during a heal: %v, want the heal's refusal\n%s", args, err, out)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE heal_range SET lifted_at = now()`); err != nil {
		t.Fatal(err)
	}
	out, err = cmd("positions", "accept", "--reason", "INC-9", "--operator", "ann")
	if err != nil || !strings.Contains(out, "moved 1 position(s)") {
		t.Errorf("accept after the lift: %v, want partition 0 moved alone\n%s", err, out)
	}
}
