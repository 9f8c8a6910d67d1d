package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// TestCrashTest SIGKILLs the consumer again and again mid-stream, restarts
// it, and checks SPEC §9 at the end. Kills alternate between two precise
// moments: while the provider has a charge in flight (the charge may be
// taken with its answer lost), and inside the window between a billing
// transaction's commit and its offset commit (proven after the kill by
// finding processed_event rows for records past the committed offset).
func TestCrashTest(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end crash test; runs in make test")
	}
	w := newWorld(t, 3, paysim.Faults{})
	// Enough orders that the default parallel mode is still mid-stream
	// after the last kill (20,000 were drained before it once the hot path
	// got faster).
	const orders = 40000
	first := time.Now().UnixMilli() * 10
	plan := mustPlan(t, harness.Spec{
		Orders: orders, FirstOrderID: first, DuplicateRate: 0.1, CrossPartitionRate: 0.3,
		Invalid: 12, SecondEvents: 2, Conflicts: 2, Declined: 3, Seed: 3, Now: time.Now(),
	})
	w.sim.SetFaults(paysim.Faults{
		Latency: 15 * time.Millisecond, LatencyJitter: 10 * time.Millisecond, ErrorRate: 0.02, ResetRate: 0.01,
		Decline: func(order int64) bool { return plan.Declined[order] },
	})
	ctx := context.Background()
	if err := harness.Produce(ctx, w.brokers, w.topic, plan.Records); err != nil {
		t.Fatal(err)
	}
	// A commit interval keeps the window between transaction commit and
	// offset commit wide open.
	env := []string{"BILLING_KAFKA_COMMIT_INTERVAL=1s"}

	const kills = 6
	inFlightKills, windowKills := 0, 0
	for i := range kills {
		before := w.ledgerRows(t)
		p := w.start(t, env, "run")
		w.waitLedger(t, p, before+300, 90*time.Second)
		if i%2 == 0 {
			deadline := time.Now().Add(10 * time.Second)
			for w.sim.InFlight() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			inFlight := w.sim.InFlight() > 0
			p.Kill()
			if inFlight {
				inFlightKills++
			}
			t.Logf("kill %d: charge in flight at the provider: %v", i+1, inFlight)
			continue
		}
		time.Sleep(700 * time.Millisecond) // well inside the 1 s commit interval
		p.Kill()
		n, err := harness.ProcessedButUncommitted(ctx, w.brokers, w.topic, w.group, w.db, 500)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			windowKills++
		}
		t.Logf("kill %d: %d events committed in Postgres but not in Kafka", i+1, n)
	}
	if inFlightKills == 0 || windowKills == 0 {
		t.Fatalf("kills hit %d in-flight charges and %d commit windows; want at least one of each", inFlightKills, windowKills)
	}

	// A graceful stop is only graceful once the consumer is up (a SIGTERM
	// during startup stops at once, exit 0, having consumed nothing), and a
	// backlog drained before the last kill leaves nothing to wait for here.
	addr := kafkatest.FreePort(t)
	p := w.start(t, append(env, "BILLING_HTTP_ADDR="+addr), "run")
	readyCtx, cancelReady := context.WithTimeout(ctx, time.Minute)
	defer cancelReady()
	if err := p.WaitReady(readyCtx, addr); err != nil {
		t.Fatalf("last start: %v", err)
	}
	w.waitDrained(t, p, 3*time.Minute)
	w.waitSettled(t, p)
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v (want exit code 0)", err)
	}
	rep := w.verify(t, plan, first, orders)
	report(t, rep)
	t.Logf("%d kills survived (%d with a charge in flight, %d between commits); provider replays %d, injected %+v",
		kills, inFlightKills, windowKills, w.sim.Replays(), w.sim.Injected())
}

func (w *world) ledgerRows(t *testing.T) int {
	t.Helper()
	var n int
	if err := w.db.QueryRow(context.Background(), "SELECT count(*) FROM charge").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitLedger waits until the ledger has at least n rows.
func (w *world) waitLedger(t *testing.T, p *harness.Process, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for w.ledgerRows(t) < n {
		if exited, err := p.Exited(); exited {
			t.Fatalf("consumer exited: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger stuck below %d rows", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
