// Package kafkatest gives tests a Kafka to talk to: the real broker named by
// BILLING_TEST_KAFKA_BROKERS (make test starts Apache Kafka with
// scripts/kafka.sh and sets it), or else an in-process franz-go kfake
// cluster, which speaks the same wire protocol, for fast hermetic runs.
//
// Under CI=true the real broker is required: the suite must not quietly
// fall back to the fake.
package kafkatest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// EnvBrokers names the variable with the real broker's host:port list.
const EnvBrokers = "BILLING_TEST_KAFKA_BROKERS"

// Brokers returns the bootstrap addresses of the broker under test.
func Brokers(t testing.TB) []string {
	t.Helper()
	if s := os.Getenv(EnvBrokers); s != "" {
		return strings.Split(s, ",")
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not set: CI runs the Kafka suite against a real broker (use make test)", EnvBrokers)
	}
	return Fake(t)
}

// Fake starts an in-process kfake cluster of one broker, closed when the
// test ends.
func Fake(t testing.TB) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// Real reports whether the tests run against a real broker.
func Real() bool { return os.Getenv(EnvBrokers) != "" }

// UniqueName returns prefix plus a random suffix: tests against a shared
// real broker must not see each other's topics and groups.
func UniqueName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// CreateTopic creates topic with the given partitions (replication factor
// 1) and waits until every partition has a leader that serves it.
func CreateTopic(t testing.TB, brokers []string, topic string, partitions int) {
	t.Helper()
	if err := CreateTopicErr(context.Background(), brokers, topic, partitions); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// CreateTopicErr is CreateTopic for callers without a testing.TB (the demo
// and benchmark harnesses). It retries while the broker is not ready (a
// fresh or restarting broker answers with retriable errors for a while).
func CreateTopicErr(ctx context.Context, brokers []string, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	created := false
	var lastErr error
	for {
		if !created {
			res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
				Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
			}}})
			if err == nil {
				err = res.Errors[topic]
			}
			if err == nil || errors.Is(err, kafka.TopicAlreadyExists) {
				created = true
			} else {
				lastErr = err
			}
		}
		if created {
			err := topicReady(ctx, client, topic, partitions)
			if err == nil {
				return nil
			}
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s not ready (last error: %v): %w", topic, lastErr, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// topicReady reports nil once every partition of topic has a leader in the
// metadata and that leader answers ListOffsets for it. Metadata alone is
// not enough: a real broker names a new partition's leader before the
// leader serves it, and for a moment answers NOT_LEADER_OR_FOLLOWER.
func topicReady(ctx context.Context, client *kafka.Client, topic string, partitions int) error {
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return err
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return fmt.Errorf("metadata of %s: %v", topic, meta.Topics)
	}
	if got := len(meta.Topics[0].Partitions); got != partitions {
		return fmt.Errorf("metadata of %s: %d partitions, want %d", topic, got, partitions)
	}
	var q []kafka.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		if p.Error != nil || p.Leader.Host == "" {
			return fmt.Errorf("partition %s/%d has no leader: %v", topic, p.ID, p.Error)
		}
		q = append(q, kafka.LastOffsetOf(p.ID))
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: q}})
	if err != nil {
		return err
	}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return fmt.Errorf("offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
	}
	return nil
}

// FreePort returns a loopback address that was free a moment ago.
func FreePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// CloneMessage is a deep copy of m, for checking later that code under test
// did not modify a message it was handed.
func CloneMessage(m kafka.Message) kafka.Message {
	c := m
	c.Key = bytes.Clone(m.Key)
	c.Value = bytes.Clone(m.Value)
	c.Headers = nil
	for _, h := range m.Headers {
		c.Headers = append(c.Headers, kafka.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	return c
}

// EqualMessages reports whether a and b have the same coordinates, key,
// value and headers (in order).
func EqualMessages(a, b kafka.Message) bool {
	if a.Topic != b.Topic || a.Partition != b.Partition || a.Offset != b.Offset ||
		!bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) || len(a.Headers) != len(b.Headers) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !bytes.Equal(a.Headers[i].Value, b.Headers[i].Value) {
			return false
		}
	}
	return true
}
