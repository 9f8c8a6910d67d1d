package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/events"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// TestHostileRecords sends records built to hurt a decoder, each followed
// on the same partition (same key) by a valid event. Every hostile record
// must end in the DLQ as invalid, every valid one must be charged: nothing
// stops the partition, and the offsets reach the end.
func TestHostileRecords(t *testing.T) {
	w := newWorld(t, 1, paysim.Faults{})
	now := time.Now().UTC()
	v7 := func() string { return uuid.Must(uuid.NewV7()).String() }
	valid := func(order int64) []byte {
		return fmt.Appendf(nil, `{"event_id":%q,"event_type":"order.confirmed.v1","occurred_at":%q,"order_id":%d,"customer_id":7,"total_amount":"12.34"}`,
			v7(), now.Format(time.RFC3339), order)
	}
	with := func(field, value string) []byte {
		fields := map[string]string{
			"event_id": fmt.Sprintf("%q", v7()), "event_type": `"order.confirmed.v1"`,
			"occurred_at": fmt.Sprintf("%q", now.Format(time.RFC3339)), "order_id": "5", "customer_id": "7", "total_amount": `"1.00"`,
		}
		fields[field] = value
		var b strings.Builder
		b.WriteString("{")
		i := 0
		for k, v := range fields {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "%q:%s", k, v)
			i++
		}
		b.WriteString("}")
		return []byte(b.String())
	}
	v4 := uuid.New()
	v8 := uuid.Must(uuid.NewV7())
	v8[6] = 0x80 | v8[6]&0x0f
	hostile := map[string][]byte{
		"oversized value":       append(valid(1), bytes.Repeat([]byte(" "), 900<<10)...),
		"deep nesting":          []byte(strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000)),
		"huge array":            fmt.Appendf(nil, `{"x":[%s1]}`, strings.Repeat("1,", 30000)),
		"invalid UTF-8":         append([]byte(`{"event_type":"order.confirmed.v1\xff\xfe"`), '}'),
		"duplicate key":         []byte(strings.Replace(string(valid(2)), `"total_amount":"12.34"`, `"total_amount":"12.34","total_amount":"99999.00"`, 1)),
		"overflowing order_id":  with("order_id", "9223372036854775808"),
		"exponent amount":       with("total_amount", "1e3"),
		"many-digit amount":     with("total_amount", `"1.0000000000000000000001"`),
		"huge amount":           with("total_amount", "123456789012345678901234567890"),
		"UUID version 4":        with("event_id", fmt.Sprintf("%q", v4)),
		"forged UUID version 8": with("event_id", fmt.Sprintf("%q", v8)),
		"occurred_at in 3 days": with("occurred_at", fmt.Sprintf("%q", now.Add(72*time.Hour).Format(time.RFC3339))),
		"UUIDv7 time in 3 days": with("event_id", fmt.Sprintf("%q", events.IDAt(now.Add(72*time.Hour)))),
		"null":                  []byte("null"),
		"empty":                 {},
		"binary":                {0, 1, 2, 3, 0xff},
	}
	var recs []kafka.Message
	order := int64(time.Now().UnixMilli() * 10)

	charged := map[int64]bool{}
	for name, v := range hostile {
		h := []kafka.Header{
			{Key: "traceparent", Value: []byte("00-zzzz-not-a-trace-\xff")},
			{Key: "", Value: bytes.Repeat([]byte{0xfe}, 4096)},
			{Key: "case", Value: []byte(name)},
		}
		recs = append(recs, kafka.Message{Key: []byte("k"), Value: v, Headers: h})
		recs = append(recs, kafka.Message{Key: []byte("k"), Value: valid(order)})
		charged[order] = true
		order++
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := harness.Produce(ctx, w.brokers, w.topic, recs); err != nil {
		t.Fatal(err)
	}
	p := w.start(t, nil, "run")
	w.waitDrained(t, p, 2*time.Minute)
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}

	dead, err := harness.ReadAll(ctx, w.brokers, w.dlqTopic)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, d := range dead {
		for _, h := range []string{"case"} {
			got[d.Headers[h]] = string(d.Reason)
		}
	}
	for name := range hostile {
		if got[name] != string(dlq.Invalid) {
			t.Errorf("%s: dead-lettered as %q, want invalid", name, got[name])
		}
	}
	for order := range charged {
		if n := w.sim.ChargesFor(order); n != 1 {
			t.Errorf("valid order %d behind a hostile record charged %d times", order, n)
		}
	}
	if rows := w.ledgerRows(t); rows != len(charged) {
		t.Errorf("ledger rows %d, want %d", rows, len(charged))
	}

}
