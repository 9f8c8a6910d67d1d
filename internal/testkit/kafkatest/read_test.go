package kafkatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// ReadTopic reads each partition in offset order up to its end, from
// ReadOptions.From and at most Limit records of each.
func TestReadTopic(t *testing.T) {
	brokers := Brokers(t)
	topic := UniqueName("readtopic")
	CreateTopic(t, brokers, topic, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: kafka.BalancerFunc(
		func(m kafka.Message, _ ...int) int { return m.Partition }), RequiredAcks: kafka.RequireAll}
	defer w.Close()
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, kafka.Message{Partition: i % 2, Value: fmt.Appendf(nil, "v%d", i)})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	values := func(ms []kafka.Message) string {
		var s []string
		for _, m := range ms {
			s = append(s, fmt.Sprintf("%d/%d:%s", m.Partition, m.Offset, m.Value))
		}
		return fmt.Sprint(s)
	}
	if got, want := values(MustReadTopic(t, brokers, topic)), "[0/0:v0 0/1:v2 0/2:v4 1/0:v1 1/1:v3]"; got != want {
		t.Errorf("everything: %s, want %s", got, want)
	}
	got, err := ReadTopic(ctx, brokers, topic, ReadOptions{From: map[int]int64{0: 1, 1: -1}, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := values(got), "[0/1:v2 1/0:v1]"; got != want {
		t.Errorf("from {0:1, 1:-1}, limit 1: %s, want %s", got, want)
	}
	got, err = ReadTopic(ctx, brokers, topic, ReadOptions{From: map[int]int64{0: 3, 1: 2}})
	if err != nil || len(got) != 0 {
		t.Errorf("from the ends: %s, %v; want nothing", values(got), err)
	}
}
