package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// TestShutdownBoundedWhenKafkaHangs: with the broker frozen (SIGSTOP:
// connections stay open, nothing answers), SIGTERM still ends the process
// within BILLING_SHUTDOWN_TIMEOUT plus a small margin. The broker is the
// test's own, so freezing it disturbs no other test.
func TestShutdownBoundedWhenKafkaHangs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own broker")
	}
	svc := startServices(t)
	w := newWorldOn(t, svc.brokers, pgtest.NewDatabaseOn(t, svc.adminURL), 3, paysim.Faults{})
	first := time.Now().UnixMilli() * 10
	plan := mustPlan(t, harness.Spec{Orders: 200, FirstOrderID: first, Seed: 1, Now: time.Now()})
	if err := harness.Produce(context.Background(), w.brokers, w.topic, plan.Records); err != nil {
		t.Fatal(err)
	}
	const shutdown = 8 * time.Second
	p := w.start(t, []string{"BILLING_SHUTDOWN_TIMEOUT=8s", "BILLING_DRAIN_TIMEOUT=3s",
		"BILLING_KAFKA_SESSION_TIMEOUT=6s"}, "run")
	w.waitDrained(t, p, time.Minute)

	svc.script(t, svc.kafkaEnv, "kafka.sh", "pause")
	t.Cleanup(func() { _, _ = svc.try(svc.kafkaEnv, "kafka.sh", "resume") })
	start := time.Now()
	err := p.Stop(shutdown + 10*time.Second)
	took := time.Since(start)
	t.Logf("stopped %v after SIGTERM with the broker frozen: %v", took.Round(time.Millisecond), err)
	if took > shutdown+3*time.Second {
		t.Fatalf("shutdown took %v with Kafka hung; BILLING_SHUTDOWN_TIMEOUT is %v", took, shutdown)
	}
	svc.script(t, svc.kafkaEnv, "kafka.sh", "resume")
	// Everything was committed before the freeze; once the broker answers
	// again, nothing is lost.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := harness.WaitDrained(ctx, w.brokers, w.topic, w.group); err != nil {
		t.Fatal(err)
	}
	report(t, w.verify(t, plan, first, 200))
}
