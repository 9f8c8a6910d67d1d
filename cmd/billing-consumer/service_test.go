package main

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// A consumer that outlives BILLING_SHUTDOWN_TIMEOUT still has an owner:
// Run returns the timeout, and Close waits for the consumer before it
// closes the pool, the batcher and the DLQ writer under it. The consumer
// here ignores its context for a while, then uses the pool.
func TestCloseWaitsForAConsumerPastTheShutdownBound(t *testing.T) {
	url := pgtest.NewDatabase(t)
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.UniqueName("billing-close")
	kafkatest.CreateTopic(t, brokers, topic, 1)
	kafkatest.CreateTopic(t, brokers, topic+".dlq", 1)
	setEnv(t, map[string]string{
		"BILLING_DATABASE_URL":            url,
		"BILLING_KAFKA_BROKERS":           strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":             topic,
		"BILLING_KAFKA_DLQ_TOPIC":         topic + ".dlq",
		"BILLING_PAYMENT_URL":             "http://127.0.0.1:1",
		"BILLING_HTTP_ADDR":               "127.0.0.1:0",
		"BILLING_KAFKA_SESSION_TIMEOUT":   "2s",
		"BILLING_KAFKA_REBALANCE_TIMEOUT": "2s",
		"BILLING_DRAIN_TIMEOUT":           "100ms",
		"BILLING_SHUTDOWN_TIMEOUT":        "200ms",
	})
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatal(err)
	}
	cfg, err := configFor(need{kafka: true, payment: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := newService(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var pingErr atomic.Value
	var ended atomic.Bool
	s.consume = func(context.Context) error { // deaf to its context
		close(started)
		time.Sleep(1500 * time.Millisecond)
		pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer pcancel()
		if err := s.db.Ping(pctx); err != nil {
			pingErr.Store(err)
		}
		ended.Store(true)
		return nil
	}
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx) }()
	select {
	case <-started:
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer was never started")
	}
	cancel()
	select {
	case err := <-runErr:
		if err == nil || !strings.Contains(err.Error(), "shutdown timed out") {
			t.Errorf("Run = %v, want the shutdown timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its shutdown bound")
	}
	if ended.Load() {
		t.Fatal("the consumer ended before the shutdown bound; the test proves nothing")
	}
	s.Close()
	if !ended.Load() {
		t.Error("Close returned while the consumer still ran")
	}
	if err := pingErr.Load(); err != nil {
		t.Errorf("the consumer's pool was closed under it: %v", err)
	}
}
