package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// completerEnv configures the service's completer of pending claims
// (SPEC §6) so that a claim left pending by a dead transaction is settled
// well within the tests' wait for pending claims (pendingWait). Every
// world's env has it.
var completerEnv = []string{"BILLING_COMPLETER_AFTER=5s", "BILLING_COMPLETER_INTERVAL=1s"}

// pendingWait bounds the wait, after the topic is drained, for every
// pending ledger claim to be settled.
const pendingWait = 60 * time.Second

// TestConnectionCuts is the end-to-end proof that an order is charged once
// even when the database connections of its billing transactions die at
// any step (issue 10, SPEC §6, §9). Two replicas of the built binary run in
// the default (parallel, batched) mode on a Kafka broker and a Postgres of
// the test's own, against the simulator. A third of the orders arrive as
// two or three distinct events under different record keys, adjacent in
// the stream, so they are on different partitions and replicas and in
// flight at once: one holds the claim of the order while the others wait
// on it. Meanwhile their Postgres connections are cut (harness.Cutter):
// while a charge is in flight at the provider; right after its answer; as
// COMMIT or the ledger claim is being sent, before the server gets it;
// while an event waits for another's claim; and at random
// moments; Postgres itself is crashed (immediate stop) and restarted; the
// provider answers 5xx and accept-then-reset; replicas are SIGKILLed. A
// transaction that dies after the provider took the money must not let
// another event of the order charge it again. Then it checks SPEC §9 from
// outside: each valid order charged exactly once at the provider, the
// provider's distinct charges equal the ledger's rows, none left pending,
// no valid event exhausted.
func TestConnectionCuts(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end fault test; runs in make test")
	}
	svc := startServices(t)
	w := newWorldOn(t, svc.brokers, pgtest.NewDatabaseOn(t, svc.adminURL), 6, paysim.Faults{})
	first := time.Now().UnixMilli() * 10
	const orders = 6000
	plan := mustPlan(t, harness.Spec{
		Orders: orders, FirstOrderID: first, DuplicateRate: 0.1, CrossPartitionRate: 0.5, Invalid: 12,
		SecondEvents: 5, Conflicts: 3, Declined: 3, ConcurrentEvents: orders / 3, EventsPerOrder: 3,
		Seed: uint64(first), Now: time.Now(),
	})
	w.sim.SetFaults(paysim.Faults{Latency: 10 * time.Millisecond, LatencyJitter: 20 * time.Millisecond,
		ErrorRate: 0.02, ResetRate: 0.01, Decline: func(order int64) bool { return plan.Declined[order] }})
	cutter := cutDatabase(t, w, harness.CutConfig{Every: 150 * time.Millisecond, Share: 0.5, Spare: 300 * time.Millisecond, Seed: uint64(first)})
	env := []string{"BILLING_KAFKA_SESSION_TIMEOUT=3s", "BILLING_KAFKA_REBALANCE_TIMEOUT=6s",
		"BILLING_DRAIN_TIMEOUT=2s", "BILLING_MAX_ATTEMPTS=30", "BILLING_RETRY_BACKOFF_MAX=1s"}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cutter.Run(ctx)
	// About 45 s of traffic: the consumers keep up, so the events of one
	// order, produced together, are billed together.
	const chunk = 40
	pause := 45 * time.Second * chunk / time.Duration(len(plan.Records))
	produced := make(chan error, 1)
	go func() { produced <- harness.Trickle(ctx, w.brokers, w.topic, plan.Records, chunk, pause) }()

	replicas := []*harness.Process{w.start(t, env, "run"), w.start(t, env, "run")}
	rng := rand.New(rand.NewPCG(uint64(first), 3))
	kills, crashes := 0, 0
	for tick := 1; ; tick++ {
		select {
		case err := <-produced:
			if err != nil {
				t.Fatalf("producing the workload: %v", err)
			}
			produced = nil
		case <-time.After(2 * time.Second):
		}
		if produced == nil {
			break
		}
		switch {
		case tick%6 == 3 && crashes < 3:
			svc.script(t, svc.pgEnv, "pg.sh", "crash")
			crashes++
		case tick%2 == 0:
			r := rng.IntN(len(replicas))
			replicas[r].Kill()
			replicas[r] = w.start(t, env, "run")
			kills++
		}
	}
	cutter.SetActive(false)
	c := w.check(plan, first, orders)
	c.ForbidExhausted = true
	end := w.settle(t, replicas, c)
	rep := end.rep
	counts, total := cutter.Counts()
	t.Logf("connection cuts: %d records (%d orders; orders by distinct events %v), %d connections cut %s "+
		"(%d rounds of pg_terminate_backend found Postgres down), %d Postgres crashes, %d SIGKILLs, provider faults %+v",
		len(plan.Records), orders, distinctHistogram(plan), total, formatCuts(counts), cutter.Failed(), crashes, kills, w.sim.Injected())
	t.Logf("double charges: %d; pending claims: %d when drained, %d left after waiting %v; ledger rows %d, provider charges %d, exhausted %d",
		len(rep.DoubleCharged), end.atDrain, end.pending, end.waited.Round(time.Second), rep.LedgerRows, rep.ProviderCharges, len(rep.Exhausted))
	report(t, rep)
	// Every step aimed at was hit (waiting for a claim may not happen
	// once claims commit before the charge: no event waits on a lock then).
	for _, k := range []harness.CutKind{harness.CutInFlight, harness.CutAnswered, harness.CutBeforeCommit, harness.CutBeforeClaim, harness.CutRandom} {
		if counts[k].Conns < 10 {
			t.Errorf("cuts %q killed %d connections, want at least 10", k, counts[k].Conns)
		}
	}
	if crashes < 3 || kills < 3 {
		t.Errorf("the run made %d Postgres crashes and %d kills, want at least 3 of each", crashes, kills)
	}
}

// cutDatabase puts a harness.PGProxy between w's binaries and Postgres and
// returns a Cutter on it, its provider hooks installed on w's simulator.
// Run the Cutter for the timed cuts.
func cutDatabase(t *testing.T, w *world, cfg harness.CutConfig) *harness.Cutter {
	t.Helper()
	u, err := url.Parse(w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := harness.StartPGProxy(u.Host, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	if w.dbURL, err = proxy.URL(w.dbURL); err != nil {
		t.Fatal(err)
	}
	cutter := harness.NewCutter(proxy, w.db, strings.TrimPrefix(u.Path, "/"), cfg)
	w.sim.SetHooks(cutter.Hooks())
	t.Cleanup(func() { cutter.SetActive(false); w.sim.SetHooks(paysim.Hooks{}) })
	return cutter
}

// settled is how a fault run ended.
type settled struct {
	rep              harness.Report
	atDrain, pending int           // pending claims when the topic was drained, and at the end
	waited           time.Duration // for the pending claims to settle
}

// settle ends a fault run once its faults have stopped: the replicas must
// still be running; the topic drains; the pending claims of c's orders get
// pendingWait to settle; the replicas stop gracefully; then c is verified.
func (w *world) settle(t *testing.T, replicas []*harness.Process, c harness.Check) settled {
	t.Helper()
	for _, r := range replicas {
		if exited, err := r.Exited(); exited {
			t.Fatalf("a replica exited by itself during the run: %v", err)
		}
	}
	w.waitDrained(t, replicas[0], 5*time.Minute)
	var end settled
	start := time.Now()
	end.atDrain = -1
	for {
		var n int
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := w.db.QueryRow(ctx, "SELECT count(*) FROM charge WHERE status = 'pending' AND order_id BETWEEN $1 AND $2",
			c.FirstOrderID, c.LastOrderID).Scan(&n)
		cancel()
		if err != nil {
			t.Fatalf("count pending claims: %v", err)
		}
		if end.atDrain < 0 {
			end.atDrain = n
		}
		if end.pending, end.waited = n, time.Since(start); n == 0 || end.waited > pendingWait {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if end.pending > 0 {
		t.Logf("%d pending claims still unsettled after %v", end.pending, pendingWait)
	}
	for _, r := range replicas {
		if err := r.Stop(30 * time.Second); err != nil {
			t.Fatalf("graceful stop after the run: %v", err)
		}
	}
	end.rep = w.verifyWith(t, c)
	return end
}

// distinctHistogram counts the plan's valid orders by their number of
// distinct events.
func distinctHistogram(plan harness.Plan) map[int]int {
	h := map[int]int{}
	for _, n := range plan.Events {
		h[n]++
	}
	return h
}

func formatCuts(counts map[harness.CutKind]harness.CutCount) string {
	var parts []string
	for _, k := range harness.CutKinds {
		parts = append(parts, fmt.Sprintf("%s: %d conns in %d cuts", k, counts[k].Conns, counts[k].Actions))
	}
	return "(" + strings.Join(parts, "; ") + ")"
}
