package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/harness"
	"github.com/billing-consumer/billing-consumer/internal/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/paysim"
	"github.com/billing-consumer/billing-consumer/internal/pgtest"
)

// chaosProfile sizes a fault-injection run. BILLING_CHAOS_PROFILE picks it:
// "short" (the default, part of make test) or "long" (make chaos).
type chaosProfile struct {
	name       string
	orders     int
	actions    int           // fault actions taken
	every      time.Duration // mean pause between actions
	minKills   int
	minFaults  int // provider faults injected (5xx, resets, timeouts)
	minCuts    int // Postgres connections cut (harness.Cutter)
	restartsPG int // half of them crashes (immediate stop)
	restartsKB int
}

func profile(t *testing.T) chaosProfile {
	switch p := os.Getenv("BILLING_CHAOS_PROFILE"); p {
	case "", "short":
		return chaosProfile{name: "short", orders: 4000, actions: 24, every: 700 * time.Millisecond,
			minKills: 8, minFaults: 50, minCuts: 100, restartsPG: 2, restartsKB: 1}
	case "long":
		return chaosProfile{name: "long", orders: 40000, actions: 300, every: 600 * time.Millisecond,
			minKills: 100, minFaults: 1000, minCuts: 1000, restartsPG: 6, restartsKB: 5}
	default:
		t.Fatalf("BILLING_CHAOS_PROFILE=%q: want short or long", p)
		return chaosProfile{}
	}
}

// services is a Postgres cluster and a Kafka broker of the chaos test's
// own, started through the project's scripts, so that restarting them does
// not disturb the tests running beside it.
type services struct {
	pgEnv, kafkaEnv []string
	adminURL        string
	brokers         []string
}

func startServices(t *testing.T) *services {
	t.Helper()
	// Not t.TempDir: Postgres runs as its own user, which must reach the
	// directory.
	dir, err := os.MkdirTemp("", "billing-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &services{
		pgEnv: []string{"PG_DIR=" + dir + "/pg", "PG_PORT=" + freePort(t)},
		kafkaEnv: []string{"KAFKA_DIR=" + dir + "/kafka", "KAFKA_PORT=" + freePort(t),
			"KAFKA_CONTROLLER_PORT=" + freePort(t)},
	}
	s.adminURL = strings.TrimSpace(s.script(t, s.pgEnv, "pg.sh", "start"))
	s.brokers = []string{strings.TrimSpace(s.script(t, s.kafkaEnv, "kafka.sh", "start"))}
	t.Cleanup(func() {
		_, _ = s.try(s.kafkaEnv, "kafka.sh", "stop")
		_, _ = s.try(s.pgEnv, "pg.sh", "stop")
	})
	return s
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(kafkatest.FreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func (s *services) try(env []string, script string, args ...string) (string, error) {
	cmd := exec.Command("../scripts/"+script, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/%s %s: %v\n%s", script, strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func (s *services) script(t *testing.T, env []string, script string, args ...string) string {
	t.Helper()
	out, err := s.try(env, script, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// cutProxy forwards TCP to the provider and can cut the network: while cut,
// it refuses new connections and has dropped the open ones.
type cutProxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() { ln.Close(); p.setCut(true); p.wg.Wait() })
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c, up)
		p.wg.Go(func() { io.Copy(up, c); up.Close() })
		p.wg.Go(func() { io.Copy(c, up); c.Close() })
	}
}

func (p *cutProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.cut.Store(cut)
	if !cut {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// TestChaos runs two consumer replicas while it kills them at random
// moments, restarts the broker, restarts and crashes Postgres, cuts
// Postgres connections at every step of the billing transactions
// (harness.Cutter, as TestConnectionCuts), cuts the network to the
// provider, turns on bursts of provider faults (5xx, accept-then-reset, 409,
// slow bodies and latency spikes past the client timeout) and replays
// already processed events from the DLQ. Duplicates, some in other
// partitions, and orders arriving as several distinct events under other
// keys, in flight at once, are part of the traffic. Then it checks SPEC §9
// from the outside, with no replay of what the run dead-lettered: no valid
// event may be exhausted, no claim left pending. It prints what it did.
// The profile sets the sizes (BILLING_CHAOS_PROFILE).
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection suite; runs in make test and make chaos")
	}
	prof := profile(t)
	svc := startServices(t)
	w := newWorldOn(t, svc.brokers, pgtest.NewDatabaseOn(t, svc.adminURL), 6, paysim.Faults{})
	proxy := newCutProxy(t, strings.TrimPrefix(w.simURL, "http://"))
	w.simURL = "http://" + proxy.ln.Addr().String()

	first := time.Now().UnixMilli() * 10
	plan := mustPlan(t, harness.Spec{
		Orders: prof.orders, FirstOrderID: first, DuplicateRate: 0.15, CrossPartitionRate: 0.5,
		Invalid: 30, SecondEvents: 10, Conflicts: 5, Declined: 5, ConcurrentEvents: prof.orders / 5, EventsPerOrder: 3,
		Seed: uint64(first), Now: time.Now(),
	})
	cutter := cutDatabase(t, w, harness.CutConfig{Every: 300 * time.Millisecond, Share: 0.3, Spare: time.Second, Seed: uint64(first)})
	// A background rate of 5xx and accept-then-reset all along, bursts on
	// top: the default mode is fast enough that a burst can fall between
	// two chunks of traffic.
	base := paysim.Faults{Latency: 2 * time.Millisecond, LatencyJitter: 8 * time.Millisecond,
		ErrorRate: 0.02, ResetRate: 0.01, ConflictRate: 0.01, SlowBodyRate: 0.005, SlowBodyDelay: 800 * time.Millisecond,
		Decline: func(order int64) bool { return plan.Declined[order] }}
	w.sim.SetFaults(base)
	env := []string{
		"BILLING_KAFKA_SESSION_TIMEOUT=3s", "BILLING_KAFKA_REBALANCE_TIMEOUT=6s", "BILLING_DRAIN_TIMEOUT=2s",
		"BILLING_SHUTDOWN_TIMEOUT=15s", "BILLING_PAYMENT_TIMEOUT=500ms", "BILLING_MAX_ATTEMPTS=30",
		"BILLING_RETRY_BACKOFF=20ms", "BILLING_RETRY_BACKOFF_MAX=1s", "BILLING_CONCURRENCY=32",
	}
	env = append(env, completerEnv...)

	// The traffic arrives throughout the run, not all at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cutter.Run(ctx)
	produced := make(chan error, 1)
	go func() {
		const chunk = 200
		pause := time.Duration(int64(prof.every) * int64(prof.actions) * chunk / int64(len(plan.Records)))
		produced <- harness.Trickle(ctx, w.brokers, w.topic, plan.Records, chunk, pause)
	}()

	replicas := []*harness.Process{w.start(t, env, "run"), w.start(t, env, "run")}
	rng := rand.New(rand.NewPCG(uint64(first), 7))
	counts := map[string]int{}
	restarts := schedule(prof)
	for i := range prof.actions {
		time.Sleep(time.Duration(rng.Int64N(int64(2 * prof.every))))
		action := pick(rng, i, restarts)
		counts[action]++
		switch action {
		case "kill":
			r := rng.IntN(len(replicas))
			replicas[r].Kill()
			replicas[r] = w.start(t, env, "run")
		case "5xx burst", "reset burst", "latency spike", "409 burst", "slow-body burst":
			f := base
			switch action {
			case "5xx burst":
				f.ErrorRate = 0.5
			case "reset burst":
				f.ResetRate = 0.3
			case "409 burst":
				f.ConflictRate = 0.3
			case "slow-body burst":
				f.SlowBodyRate = 0.3 // each slower than the 500 ms client timeout
			default:
				f.Latency = 700 * time.Millisecond // past the 500 ms client timeout: outcome unknown
			}
			w.sim.SetFaults(f)
			time.Sleep(prof.every)
			w.sim.SetFaults(base)
		case "provider cut":
			proxy.setCut(true)
			time.Sleep(2 * time.Second)
			proxy.setCut(false)
		case "broker restart":
			svc.script(t, svc.kafkaEnv, "kafka.sh", "restart")
		case "postgres restart":
			svc.script(t, svc.pgEnv, "pg.sh", "restart")
		case "postgres crash":
			svc.script(t, svc.pgEnv, "pg.sh", "crash")
		case "replay of processed events":
			if err := replayProcessed(w, plan, rng); err != nil {
				t.Fatalf("replay of processed events: %v", err)
			}
		}
	}
	if err := <-produced; err != nil {
		t.Fatalf("producing the workload: %v", err)
	}
	w.sim.SetFaults(base)
	proxy.setCut(false)
	cutter.SetActive(false)

	// No replay of what the run dead-lettered: every valid event must have
	// been charged by the consumers themselves.
	for _, r := range replicas {
		if exited, err := r.Exited(); exited {
			t.Fatalf("a replica exited by itself during the run: %v", err)
		}
	}
	w.waitDrained(t, replicas[0], 5*time.Minute)
	atDrain, pending, waited := w.waitNoPending(t, first, prof.orders, pendingWait)
	for _, r := range replicas {
		if err := r.Stop(30 * time.Second); err != nil {
			t.Fatalf("graceful stop after the run: %v", err)
		}
	}

	c := w.check(plan, first, prof.orders)
	c.ForbidExhausted = true
	c.Planted = func(r harness.DLQRecord) bool { return r.Headers[chaosCopyHeader] != "" }
	rep := w.verifyWith(t, c)
	inj := w.sim.Injected()
	lost := len(rep.NotCharged) + rep.InvalidMissing
	cuts, cutConns := cutter.Counts()
	t.Logf("chaos profile %s: %d records (orders by distinct events %v), %d actions %v",
		prof.name, len(plan.Records), distinctHistogram(plan), prof.actions, counts)
	faults := inj.Errors + inj.Resets + inj.Conflicts + inj.SlowBodies
	t.Logf("kills survived: %d; provider faults injected: %d (%d 5xx, %d accept-then-reset, %d 409, %d slow bodies), plus %d declines; replays served %d",
		counts["kill"], faults, inj.Errors, inj.Resets, inj.Conflicts, inj.SlowBodies, inj.Declines, w.sim.Replays())
	t.Logf("Postgres connections cut: %d %s", cutConns, formatCuts(cuts))
	t.Logf("double charges: %d; lost events: %d; exhausted valid events: %d; pending claims: %d when drained, %d left after %v; DLQ %v",
		len(rep.DoubleCharged), lost, len(rep.Exhausted), atDrain, pending, waited.Round(time.Second), rep.DLQ)
	report(t, rep)
	if counts["kill"] < prof.minKills || faults < prof.minFaults || cutConns < prof.minCuts {
		t.Fatalf("the run injected %d kills, %d provider faults and %d connection cuts; the %s profile promises at least %d, %d and %d",
			counts["kill"], faults, cutConns, prof.name, prof.minKills, prof.minFaults, prof.minCuts)
	}
}

// schedule places the broker and Postgres restarts evenly over the run,
// alternating; every other Postgres restart is a crash (immediate stop).
func schedule(prof chaosProfile) map[int]string {
	m := map[int]string{}
	n := prof.restartsPG + prof.restartsKB
	pg, kb := 0, 0
	for k := range n {
		what := "broker restart"
		switch {
		case pg < prof.restartsPG && (k%2 == 1 || kb == prof.restartsKB):
			what = "postgres restart"
			if pg%2 == 1 {
				what = "postgres crash"
			}
			pg++
		default:
			kb++
		}
		m[(k+1)*prof.actions/(n+1)] = what
	}
	return m
}

// pick chooses the i-th action: the scheduled restarts, otherwise a kill
// every other action (so a profile's kill count does not depend on luck)
// and one of the other faults in between.
func pick(rng *rand.Rand, i int, restarts map[int]string) string {
	if what, ok := restarts[i]; ok {
		return what
	}
	if i%2 == 0 {
		return "kill"
	}
	others := []string{"5xx burst", "reset burst", "latency spike", "409 burst", "slow-body burst",
		"provider cut", "replay of processed events"}
	return others[rng.IntN(len(others))]
}

// chaosCopyHeader marks the records replayProcessed plants in the DLQ, so
// that the final check tells them from the consumers' own.
const chaosCopyHeader = "chaos-copy"

// replayProcessed copies a few records of charged orders into the DLQ and
// replays them: they must come out as duplicates. (Invalid or declined
// records would come back to the DLQ and, replayed again and again, reach
// the replay limit, which stops every later replay by design.) An error
// means the replay did not happen.
func replayProcessed(w *world, plan harness.Plan, rng *rand.Rand) error {
	var recs []kafka.Message
	for start := rng.IntN(len(plan.Records)); len(recs) < 20 && start < len(plan.Records); start++ {
		m := plan.Records[start]
		var ev struct {
			OrderID int64  `json:"order_id"`
			Amount  string `json:"total_amount"`
		}
		if json.Unmarshal(m.Value, &ev) != nil {
			continue
		}
		if amount, ok := plan.Charged[ev.OrderID]; !ok || amount.String() != ev.Amount {
			continue // not a charged order, or its conflicting second event
		}
		m.Topic = w.topic
		rec := dlq.Record(m, w.group, dlq.Exhausted, fmt.Errorf("chaos: copied"), 1, time.Now())
		rec.Headers = append(rec.Headers, kafka.Header{Key: chaosCopyHeader, Value: []byte("1")})
		recs = append(recs, rec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Trickle resends while the broker is busy, until ctx ends.
	if err := harness.Trickle(ctx, w.brokers, w.dlqTopic, recs, len(recs), 0); err != nil {
		return fmt.Errorf("copy records to the DLQ: %w", err)
	}
	// Only the copies (reason exhausted): the consumer's own invalid,
	// permanent and conflict records would come back to the DLQ on every
	// round and, at the replay limit, stop every later replay by design.
	// (The consumers dead-letter no valid event as exhausted: the final
	// check fails on any.)
	p, err := harness.Start(w.bin, []string{"dlq", "replay", "--reason", "exhausted"}, w.env(), w.log)
	if err != nil {
		return err
	}
	defer p.Kill()
	if err := p.Wait(ctx); err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	return nil
}
