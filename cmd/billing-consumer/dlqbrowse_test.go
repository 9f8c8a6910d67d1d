package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// TestDLQListAndInspect runs `dlq list` and `dlq inspect` against a broker
// with no database configured: each filter selects exactly the records it
// names, --json is one object per line, inspect shows the record in full,
// and a record dlq replay has passed is marked replayed.
func TestDLQListAndInspect(t *testing.T) {
	brokers := kafkatest.Brokers(t)
	topic, dlqTopic := kafkatest.UniqueName("cmd-browse"), kafkatest.UniqueName("cmd-browse-dlq")
	group := kafkatest.UniqueName("cmd-browse-billing")
	kafkatest.CreateTopic(t, brokers, topic, 1)
	kafkatest.CreateTopic(t, brokers, dlqTopic, 2)
	setEnv(t, map[string]string{
		"BILLING_KAFKA_BROKERS":   strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":     topic,
		"BILLING_KAFKA_DLQ_TOPIC": dlqTopic,
		"BILLING_KAFKA_GROUP_ID":  group,
	})
	old := time.Now().Add(-48 * time.Hour)
	dead := func(partition int, order int64, value string, reason dlq.Reason, at time.Time) kafka.Message {
		src := kafka.Message{Topic: topic, Partition: 0, Offset: order, Key: []byte(strconv.FormatInt(order, 10)), Value: []byte(value)}
		m := dlq.Record(src, group, reason, errors.New("boom "+string(reason)), 3, at)
		m.Partition = partition
		return m
	}
	ev := func(order int64) string {
		return `{"event_type":"order.confirmed.v1","order_id":` + strconv.FormatInt(order, 10) + `,"customer_id":7,"total_amount":"12.50"}`
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: dlqTopic, Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		Transport: &kafka.Transport{}, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	t.Cleanup(func() { _ = w.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx,
		dead(0, 0, "garbage", dlq.Invalid, time.Now()),
		dead(0, 1001, ev(1001), dlq.Conflict, time.Now()),
		dead(1, 1002, ev(1002), dlq.Exhausted, old),
		dead(1, 1003, ev(1003), dlq.Exhausted, time.Now()),
	); err != nil {
		t.Fatal(err)
	}

	browse := func(args ...string) (string, error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"dlq"}, args...), &out, &errOut)
		return out.String(), err
	}
	rows := func(out string) []string { // data lines of list, header dropped
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return lines[1:]
	}

	out, err := browse("list")
	if err != nil || len(rows(out)) != 4 || !strings.HasPrefix(out, "PARTITION") {
		t.Fatalf("list = %v\n%s", err, out)
	}
	out, err = browse("list", "--reason", "conflict")
	if r := rows(out); err != nil || len(r) != 1 || !strings.Contains(r[0], "conflict") || !strings.Contains(r[0], "1001") {
		t.Fatalf("list --reason conflict = %v\n%s", err, out)
	}
	if strings.Contains(out, "12.50") {
		t.Errorf("list shows amounts:\n%s", out)
	}
	out, err = browse("list", "--reason", "exhausted", "--since", "24h")
	if r := rows(out); err != nil || len(r) != 1 || !strings.Contains(r[0], "1003") {
		t.Fatalf("list --reason exhausted --since 24h = %v\n%s", err, out)
	}
	out, err = browse("list", "--order", "1002", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got []entryView
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var v entryView
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("list --json line %q: %v", l, err)
		}
		got = append(got, v)
	}
	if len(got) != 1 || got[0].OrderID != 1002 || got[0].Reason != "exhausted" || got[0].Partition != 1 ||
		got[0].Attempts != 3 || got[0].Error != "boom exhausted" || got[0].Value != nil || got[0].Replayed {
		t.Fatalf("list --order 1002 --json = %+v", got)
	}

	out, err = browse("inspect", "--order", "1001")
	if err != nil || !strings.Contains(out, ev(1001)) || !strings.Contains(out, "header dlq-reason: conflict") {
		t.Fatalf("inspect --order 1001 = %v\n%s", err, out)
	}
	out, err = browse("inspect", "--reason", "invalid", "--json")
	var v entryView
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Value == nil || *v.Value != "garbage" || v.Headers[dlq.HeaderReason] != "invalid" {
		t.Fatalf("inspect --reason invalid --json = %v\n%s", err, out)
	}

	// After dlq replay has passed the records, list says so.
	var sink bytes.Buffer
	if err := run(ctx, []string{"dlq", "replay", "--reason", "exhausted"}, &sink, &sink); err != nil {
		t.Fatalf("replay: %v\n%s", err, sink.String())
	}
	out, err = browse("list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	// Only the two exhausted ones: the invalid and the conflict records
	// were not selected, and stay not replayed (they were once marked).
	if n := strings.Count(out, `"replayed":true`); n != 2 || strings.Contains(out, `"reason":"invalid","error":"boom invalid","attempts":3,"replayed":true`) ||
		strings.Contains(out, `"reason":"conflict"`) && strings.Contains(out, `"order_id":1001,"replayed":true`) {
		t.Errorf("after a replay of the exhausted records, %d records marked replayed, want those 2\n%s", n, out)
	}

	for _, bad := range [][]string{{"list", "--reason", "other"}, {"list", "--since", "yesterday"}, {"inspect", "--order", "-1"}, {"list", "x"}} {
		if _, err := browse(bad...); err == nil || !errors.Is(err, errUsage) {
			t.Errorf("dlq %v = %v, want a usage error", bad, err)
		}
	}
}

// -h of dlq list and inspect prints their flags and needs no configuration.
func TestDLQBrowseHelp(t *testing.T) {
	cleanEnv(t)
	for _, name := range []string{"list", "inspect"} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"dlq", name, "-h"}, &out, &errOut); err != nil {
			t.Fatalf("dlq %s -h: %v", name, err)
		}
		for _, want := range []string{"Usage: billing-consumer dlq " + name, "-reason", "-since", "-order", "-json"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("dlq %s -h lacks %q:\n%s", name, want, out.String())
			}
		}
	}
}
