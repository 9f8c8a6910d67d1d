package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// workload returns n records of n distinct orders from first on: valid
// events only, no duplicates, so each record must charge once.
func workload(first int64, n int) ([]kafka.Message, error) {
	plan, err := harness.Generate(harness.Spec{Orders: n, FirstOrderID: first, Seed: uint64(first), Now: time.Now()})
	if err != nil {
		return nil, err
	}
	return plan.Records, nil
}

// produceSteady sends recs at rate records/s, each with Time set to the
// moment it is handed to the writer, and returns when all are
// acknowledged. A write that takes longer than a tick makes the next tick
// send more, so the offered rate holds on average.
func produceSteady(ctx context.Context, brokers []string, topic string, recs []kafka.Message, rate float64) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, Transport: tr,
	}
	defer w.Close()
	start := time.Now()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	sent := 0
	for sent < len(recs) {
		due := min(len(recs), int(time.Since(start).Seconds()*rate)+1)
		if due > sent {
			batch := recs[sent:due]
			now := time.Now()
			for i := range batch {
				batch[i].Time = now
			}
			if err := w.WriteMessages(ctx, batch...); err != nil {
				return fmt.Errorf("produce to %s: %w", topic, err)
			}
			sent = due
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// readBack reads every record of topic up to the log-end offsets of the
// moment, with partition, offset, timestamp and order id.
func readBack(ctx context.Context, brokers []string, topic string) ([]record, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	msgs, err := kafkatest.ReadTopic(rctx, brokers, topic, kafkatest.ReadOptions{MaxBytes: 4 << 20})
	if err != nil {
		return nil, fmt.Errorf("read back: %w", err)
	}
	out := make([]record, 0, len(msgs))
	for _, m := range msgs {
		var ev struct {
			OrderID int64 `json:"order_id"`
		}
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return nil, fmt.Errorf("read back %s/%d@%d: %w", topic, m.Partition, m.Offset, err)
		}
		out = append(out, record{partition: m.Partition, offset: m.Offset, time: m.Time, orderID: ev.OrderID})
	}
	return out, nil
}
