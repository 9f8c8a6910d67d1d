package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// idleGoroutines is the most goroutines an idle replica owning 6
// partitions may hold (issue 22: "a few hundred"; b522a65 held about
// 2,100, two pools of BILLING_CONCURRENCY workers).
const idleGoroutines = 300

// TestIdleReplicaShrinks: a replica with the default settings
// (BILLING_CONCURRENCY=1024) bills a burst of 3,000 orders on 6 partitions,
// growing its workers with the work; once the topic is drained and the
// replica idle, its goroutines (go_goroutines on /metrics) fall back to a
// few hundred.
func TestIdleReplicaShrinks(t *testing.T) {
	const orders = 3_000
	w := newWorld(t, 6, paysim.Faults{Latency: 5 * time.Millisecond})
	first := time.Now().UnixMilli()*10 + 3
	plan := mustPlan(t, harness.Spec{Orders: orders, FirstOrderID: first, Seed: 6, Now: time.Now()})
	if err := harness.Produce(context.Background(), w.brokers, w.topic, plan.Records); err != nil {
		t.Fatal(err)
	}
	addr, pprof := kafkatest.FreePort(t), kafkatest.FreePort(t)
	p := w.start(t, []string{"BILLING_HTTP_ADDR=" + addr, "BILLING_PPROF_ADDR=" + pprof}, "run")
	t.Cleanup(func() {
		if t.Failed() { // where the goroutines are
			_, body := opsGet(t, "http://"+pprof+"/debug/pprof/goroutine?debug=1")
			t.Logf("goroutines of the idle replica:\n%.4000s", body)
		}
	})
	w.waitDrained(t, p, 2*time.Minute)
	goroutines := func() float64 {
		return scrapeOps(t, "http://"+addr+"/metrics")["go_goroutines"].sumFor("")
	}
	busy := goroutines()
	var idle float64
	pollOps(t, time.Minute, fmt.Sprintf("the idle replica to hold at most %d goroutines", idleGoroutines), func() string {
		if idle = goroutines(); idle > idleGoroutines {
			return fmt.Sprintf("%.0f goroutines", idle)
		}
		return ""
	})
	t.Logf("goroutines: %.0f just after the drain, %.0f idle", busy, idle)
	report(t, w.verify(t, plan, first, orders))
}
