package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// Produce writes records to topic, partitioned by key hash, acknowledged by
// all in-sync replicas.
func Produce(ctx context.Context, brokers []string, topic string, records []kafka.Message) error {
	// Its own transport: kafka-go's shared default one caches metadata for
	// seconds and may not know a topic created a moment ago.
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchSize: 500,
		Transport: tr,
	}
	defer w.Close()
	const chunk = 1000
	for i := 0; i < len(records); i += chunk {
		if err := w.WriteMessages(ctx, records[i:min(i+chunk, len(records))]...); err != nil {
			return fmt.Errorf("produce to %s: %w", topic, err)
		}
	}
	return nil
}

// Lag returns the group's position on every partition of topic. It
// retries for a few seconds while the broker is not ready (just restarted
// or resumed: "not leader", "not available").
func Lag(ctx context.Context, brokers []string, topic, group string) ([]consumer.PartitionLag, error) {
	var err error
	for try := 0; try < 20; try++ {
		tr := &kafka.Transport{}
		client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
		var lags []consumer.PartitionLag
		lags, err = consumer.GroupLag(ctx, client, topic, group)
		tr.CloseIdleConnections()
		if err == nil {
			return lags, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(300 * time.Millisecond):
		}
	}
	return nil, err
}

// WaitDrained polls until the group's committed offset equals the log-end
// offset on every partition of topic, or ctx ends.
func WaitDrained(ctx context.Context, brokers []string, topic, group string) error {
	var last []consumer.PartitionLag
	for {
		lags, err := Lag(ctx, brokers, topic, group)
		if err == nil {
			last = lags
			drained := true
			for _, l := range lags {
				if l.Committed < 0 || l.Committed != l.End {
					drained = false
				}
			}
			if drained && len(lags) > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s not drained by group %s: %+v: %w", topic, group, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// DLQRecord is a dead-lettered record as read back.
type DLQRecord struct {
	Value   string
	Reason  dlq.Reason
	Headers map[string]string
}

// ReadAll reads every record of topic from the beginning up to the log-end
// offsets at the time of the call.
func ReadAll(ctx context.Context, brokers []string, topic string) ([]DLQRecord, error) {
	msgs, err := kafkatest.ReadTopic(ctx, brokers, topic, kafkatest.ReadOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]DLQRecord, 0, len(msgs))
	for _, m := range msgs {
		h := map[string]string{}
		for _, hd := range m.Headers {
			h[hd.Key] = string(hd.Value)
		}
		out = append(out, DLQRecord{Value: string(m.Value), Reason: dlq.Reason(h[dlq.HeaderReason]), Headers: h})
	}
	return out, nil
}

// Trickle produces records in chunks of chunk, pausing pause after each,
// so that the traffic arrives throughout a run rather than all at once. A
// chunk that fails (the broker restarting) is sent again after a short
// wait until ctx ends.
func Trickle(ctx context.Context, brokers []string, topic string, records []kafka.Message, chunk int, pause time.Duration) error {
	for i := 0; i < len(records); i += chunk {
		recs := records[i:min(i+chunk, len(records))]
		for {
			err := Produce(ctx, brokers, topic, recs)
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(200 * time.Millisecond): // the broker is restarting
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
	return nil
}
