package main

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/logtest"
)

// The command line of dlq replay is checked before the configuration: a
// wrong one is one line pointing to help, with no output.
func TestDLQReplayWrongCommandLine(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq"}, "dlq: missing subcommand"},
		{[]string{"dlq", "reply"}, `dlq: unknown subcommand "reply"`},
		{[]string{"dlq", "replay", "--bogus"}, "dlq replay: flag provided but not defined: -bogus"},
		{[]string{"dlq", "replay", "--max"}, "dlq replay: flag needs an argument: -max"},
		{[]string{"dlq", "replay", "--max", "ten"}, `dlq replay: invalid value "ten" for flag -max`},
		{[]string{"dlq", "replay", "--max", "0"}, "dlq replay: --max must be at least 1, got 0"},
		{[]string{"dlq", "replay", "--max=-3"}, "dlq replay: --max must be at least 1, got -3"},
		{[]string{"dlq", "replay", "--reason", "Exhausted"}, `dlq replay: --reason: unknown reason "Exhausted"`},
		{[]string{"dlq", "replay", "--reason="}, `dlq replay: --reason: unknown reason ""`},
		{[]string{"dlq", "replay", "--partition", "0"}, "dlq replay: --partition and --offset go together"},
		{[]string{"dlq", "replay", "--offset", "3"}, "dlq replay: --partition and --offset go together"},
		{[]string{"dlq", "replay", "--order", "0"}, "dlq replay: --order must be a positive order id, got 0"},
		{[]string{"dlq", "replay", "--order=-5"}, "dlq replay: --order must be a positive order id, got -5"},
		{[]string{"dlq", "replay", "--order", "7", "--partition", "1", "--offset", "2", "--reason", "conflict"}, ""},
		{[]string{"dlq", "replay", "--dry-run", "now"}, `dlq replay: unexpected argument "now"`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			// Valid but unreachable Kafka: a command line that passes fails
			// later, on the connection.
			setEnv(t, map[string]string{"BILLING_KAFKA_BROKERS": "127.0.0.1:1"})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stdout, stderr bytes.Buffer
			err := run(ctx, tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatal("accepted")
			}
			if tt.want == "" {
				if errors.Is(err, errUsage) {
					t.Errorf("rejected as a wrong command line: %v", err)
				}
				return
			}
			if !errors.Is(err, errUsage) || !strings.HasPrefix(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line starting %q that points to help", err, tt.want)
			}
			if stdout.Len() != 0 || stderr.Len() != 0 {
				t.Errorf("output %q %q for a wrong command line", stdout.String(), stderr.String())
			}
		})
	}
}

func TestDLQReplayHelp(t *testing.T) {
	cleanEnv(t)
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"dlq", "replay", "-h"}, &stdout, &stderr); err != nil {
		t.Fatalf("dlq replay -h: %v", err)
	}
	for _, want := range []string{"-max N", "-dry-run", "-reason R", "exhausted"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("dlq replay -h does not mention %q:\n%s", want, stdout.String())
		}
	}
}

// dlq replay needs Kafka, and only Kafka; the database commands and run
// still need the database.
func TestDLQReplayNeedsKafkaNotTheDatabase(t *testing.T) {
	for _, tt := range []struct {
		name    string
		env     map[string]string
		args    []string
		wantVar string
	}{
		{"replay without brokers", map[string]string{}, []string{"dlq", "replay"}, "BILLING_KAFKA_BROKERS"},
		{"replay, bad broker", map[string]string{"BILLING_KAFKA_BROKERS": "kafka"}, []string{"dlq", "replay"}, "BILLING_KAFKA_BROKERS"},
		{"replay limit zero", map[string]string{"BILLING_KAFKA_BROKERS": "k:9092", "BILLING_DLQ_MAX_REPLAYS": "0"},
			[]string{"dlq", "replay"}, "BILLING_DLQ_MAX_REPLAYS"},
		{"replay limit garbage", map[string]string{"BILLING_KAFKA_BROKERS": "k:9092", "BILLING_DLQ_MAX_REPLAYS": "many"},
			[]string{"dlq", "replay"}, "BILLING_DLQ_MAX_REPLAYS"},
		{"replay group is the consumer group", map[string]string{"BILLING_KAFKA_BROKERS": "k:9092",
			"BILLING_DLQ_REPLAY_GROUP_ID": "billing-order-confirmed"}, []string{"dlq", "replay"}, "BILLING_DLQ_REPLAY_GROUP_ID"},
		{"run without database", map[string]string{"BILLING_KAFKA_BROKERS": "k:9092", "BILLING_PAYMENT_URL": "http://p"},
			[]string{"run"}, "BILLING_DATABASE_URL"},
		{"migrate without database", map[string]string{}, []string{"migrate"}, "BILLING_DATABASE_URL"},
		{"retention without database", map[string]string{}, []string{"retention"}, "BILLING_DATABASE_URL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantVar+": ") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%v: %v, want one line about %s", tt.args, err, tt.wantVar)
			}
			if stdout.Len() != 0 || stderr.Len() != 0 {
				t.Errorf("output %q %q for a configuration error", stdout.String(), stderr.String())
			}
		})
	}
}

// TestDLQReplayCommand runs `dlq replay` against a broker, with no database
// or provider configured: a dry run, a filtered run with --max, the rest,
// and a stop at the replay limit.
func TestDLQReplayCommand(t *testing.T) {
	brokers := kafkatest.Brokers(t)
	topic, dlqTopic := kafkatest.UniqueName("cmd-orders"), kafkatest.UniqueName("cmd-orders-dlq")
	group := kafkatest.UniqueName("cmd-billing")
	kafkatest.CreateTopic(t, brokers, topic, 2)
	kafkatest.CreateTopic(t, brokers, dlqTopic, 1)
	setEnv(t, map[string]string{
		"BILLING_KAFKA_BROKERS":   strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":     topic,
		"BILLING_KAFKA_DLQ_TOPIC": dlqTopic,
		"BILLING_KAFKA_GROUP_ID":  group,
		"BILLING_DLQ_MAX_REPLAYS": "2",
	})

	dead := func(i int, reason dlq.Reason, replays int) kafka.Message {
		src := kafka.Message{Topic: topic, Partition: i % 2, Offset: int64(i), Key: []byte(strconv.Itoa(i)), Value: []byte("event-" + strconv.Itoa(i))}
		if replays > 0 {
			src.Headers = []kafka.Header{{Key: dlq.HeaderReplayCount, Value: []byte(strconv.Itoa(replays))}}
		}
		return dlq.Record(src, group, reason, errors.New("boom"), 8, time.Now())
	}
	dlqProduce(t, brokers, dlqTopic,
		dead(0, dlq.Exhausted, 0), dead(1, dlq.Invalid, 0), dead(2, dlq.Exhausted, 1), dead(3, dlq.Exhausted, 0))

	replay := func(args ...string) (summary map[string][3]int, stdout string, logs []map[string]any, err error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		var out bytes.Buffer
		var errOut logtest.Buffer
		err = run(ctx, append([]string{"dlq", "replay"}, args...), &out, &errOut)
		return parseSummary(t, out.String()), out.String(), logLines(t, errOut.String()), err
	}

	sum, out, _, err := replay("--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	// By default only the exhausted records are selected.
	if !strings.Contains(out, "dry run") || sum["exhausted"] != [3]int{3, 0, 0} || sum["invalid"] != [3]int{0, 1, 0} ||
		sum["total"] != [3]int{3, 1, 0} {
		t.Fatalf("dry run summary:\n%s", out)
	}

	sum, out, logs, err := replay("--reason", "exhausted", "--max", "1")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	if sum["exhausted"] != [3]int{1, 0, 0} || sum["total"] != [3]int{1, 0, 0} || !strings.Contains(out, "stopped after --max 1") {
		t.Fatalf("summary of --max 1:\n%s", out)
	}
	if n := len(logsWithMsg(logs, "dead-letter record replayed")); n != 1 {
		t.Errorf("%d JSON log lines for replayed records, want 1", n)
	}

	sum, out, _, err = replay("--reason", "exhausted")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	if sum["exhausted"] != [3]int{2, 0, 0} || sum["invalid"] != [3]int{0, 1, 0} || sum["total"] != [3]int{2, 1, 0} {
		t.Fatalf("summary of the rest:\n%s", out)
	}
	if got := countRecords(t, brokers, topic); got != 3 {
		t.Fatalf("source topic has %d records, want 3", got)
	}

	// A record at the limit: no table, one line naming the record.
	dlqProduce(t, brokers, dlqTopic, dead(4, dlq.Exhausted, 2))
	for range 2 {
		var out bytes.Buffer
		var errOut logtest.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		err := run(ctx, []string{"dlq", "replay"}, &out, &errOut)
		cancel()
		if err == nil || !strings.HasPrefix(err.Error(), "dlq replay stopped (it republished 0 record(s) before): refused record "+dlqTopic+"/0@4: dlq-replay-count 2 has reached the limit of 2 replays") ||
			strings.Contains(err.Error(), "\n") {
			t.Fatalf("replay at the limit: %v, want a refusal of %s/0@4", err, dlqTopic)
		}
		if out.Len() != 0 {
			t.Errorf("stdout at the limit:\n%s", out.String())
		}
		logs = logLines(t, errOut.String())
		if len(logsWithMsg(logs, "dead-letter record refused, replay stops")) != 1 {
			t.Errorf("the refusal is not logged")
		}
	}
}

// parseSummary reads the REASON REPLAYED NOT_SELECTED REFUSED table.
func parseSummary(t *testing.T, out string) map[string][3]int {
	t.Helper()
	rows := map[string][3]int{}
	in := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "REASON" {
			in = true
			continue
		}
		if !in || len(f) != 4 {
			continue
		}
		var row [3]int
		for i := range 3 {
			n, err := strconv.Atoi(f[i+1])
			if err != nil {
				t.Fatalf("summary row %q", line)
			}
			row[i] = n
		}
		rows[f[0]] = row
	}
	for _, r := range []string{"invalid", "permanent", "conflict", "exhausted", "total"} {
		if _, ok := rows[r]; !ok {
			t.Fatalf("summary lacks a %s line:\n%s", r, out)
		}
	}
	return rows
}

func dlqProduce(t *testing.T, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, Transport: &kafka.Transport{}}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// countRecords counts the records of topic.
func countRecords(t *testing.T, brokers []string, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(meta.Topics) != 1 {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	var reqs []kafka.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p.ID))
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, po := range res.Topics[topic] {
		n += int(po.LastOffset)
	}
	return n
}
