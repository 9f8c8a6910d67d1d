package dlq

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// TestSendTruncatesWhatTheTopicRefuses: a record larger than the
// dead-letter topic's max.message.bytes is dead-lettered with the head of
// its value and dlq-value-truncated, instead of blocking its partition.
func TestSendTruncatesWhatTheTopicRefuses(t *testing.T) {
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.UniqueName("dlq-small")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "200000"}},
	}}})
	if err != nil || res.Errors[topic] != nil {
		t.Fatalf("create topic: %v %v", err, res.Errors[topic])
	}
	kafkatest.CreateTopic(t, brokers, topic, 1) // waits for a leader
	w, err := NewWriter(WriterConfig{Brokers: brokers, Topic: topic, GroupID: "g", Now: time.Now, Transport: &kafka.Transport{}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	big := bytes.Repeat([]byte("x"), 500_000)
	msg := kafka.Message{Topic: "src", Partition: 0, Offset: 9, Key: []byte("k"), Value: big}
	if err := w.Send(ctx, msg, Invalid, errors.New("record too large"), 1); err != nil {
		t.Fatalf("Send: %v", err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0,
		Dialer: &kafka.Dialer{Timeout: 10 * time.Second}, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	got, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Value) != MaxTruncatedValue || !bytes.Equal(got.Value, big[:MaxTruncatedValue]) {
		t.Fatalf("value of %d bytes, want the first %d", len(got.Value), MaxTruncatedValue)
	}
	var size string
	for _, h := range got.Headers {
		if h.Key == HeaderValueTruncated {
			size = string(h.Value)
		}
	}
	if size != strconv.Itoa(len(big)) {
		t.Fatalf("%s = %q, want %d", HeaderValueTruncated, size, len(big))
	}
}
