package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// TestReplayDuplicatesAreHarmless proves SPEC §7's replay safe by
// construction, with the real binary: the DLQ holds events the provider
// never charged (retries exhausted during an outage) and events that were
// charged (copied there by hand, as a DLQ write after a lost answer would),
// and is then replayed twice, the second time by another replay group as if
// every commit of the first had been lost. Every order must still be
// charged exactly once; the charged events come back as duplicates, and a
// declined event that keeps failing is stopped by the replay limit.
func TestReplayDuplicatesAreHarmless(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end replay test; runs in make test")
	}
	w := newWorld(t, 3, paysim.Faults{})
	first := time.Now().UnixMilli()*10 + 5
	const orders, outage, copies = 60, 20, 10
	plan := mustPlan(t, harness.Spec{Orders: orders, FirstOrderID: first, Declined: 3, Seed: 11, Now: time.Now()})
	decline := func(order int64) bool { return plan.Declined[order] }
	w.sim.SetFaults(paysim.Faults{Decline: decline})
	healthy, down := splitByOrder(plan.Records, first+orders-outage)
	ctx := context.Background()

	metricsAddr := kafkatest.FreePort(t)
	// Outage detection and the retry budget off: this test wants the
	// provider's failures to exhaust the events into the DLQ after two
	// attempts, as a poison provider would. The completer waits an hour:
	// the exhausted events' claims stay pending for the replay to settle.
	p := w.start(t, []string{"BILLING_MAX_ATTEMPTS=2", "BILLING_RETRY_BUDGET=0", "BILLING_OUTAGE_THRESHOLD=0",
		"BILLING_OUTAGE_AFTER=0", "BILLING_COMPLETER_AFTER=1h", "BILLING_CLAIM_BLOCK_AFTER=2h",
		"BILLING_HTTP_ADDR=" + metricsAddr}, "run")
	if err := harness.Produce(ctx, w.brokers, w.topic, healthy); err != nil {
		t.Fatal(err)
	}
	w.waitDrained(t, p, 2*time.Minute)

	// The provider is down: the last orders exhaust their 2 attempts.
	w.sim.SetFaults(paysim.Faults{ErrorRate: 1, Decline: decline})
	if err := harness.Produce(ctx, w.brokers, w.topic, down); err != nil {
		t.Fatal(err)
	}
	w.waitDrained(t, p, 2*time.Minute)
	if got := w.dlqCount(t, dlq.Exhausted); got != outage {
		t.Fatalf("DLQ holds %d exhausted records after the outage, want %d", got, outage)
	}
	w.sim.SetFaults(paysim.Faults{Decline: decline})

	// Charged events dead-lettered as well, as they were consumed.
	var charged []kafka.Message
	for _, m := range kafkatest.MustReadTopic(t, w.brokers, w.topic) {
		if order := orderOf(t, m); order < first+orders-outage && !plan.Declined[order] && len(charged) < copies {
			charged = append(charged, dlq.Record(m, w.group, dlq.Exhausted, errors.New("payment: timeout"), 2, time.Now()))
		}
	}
	if err := harness.Produce(ctx, w.brokers, w.dlqTopic, charged); err != nil {
		t.Fatal(err)
	}

	// 1. The outage is over: replay what was exhausted.
	out, err := w.replay(t, nil, "--reason", "exhausted")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	t.Logf("first replay:\n%s", out)
	wantRow(t, out, "exhausted", outage+copies, 0, 0)
	wantRow(t, out, "permanent", 0, 3, 0)
	w.waitDrained(t, p, 2*time.Minute)

	// 2. Everything again, from the start, by another group (the exhausted
	// records by default, then the declined ones by name): each replayed
	// event now reaches the consumer a third time; the declined ones fail
	// again and come back to the DLQ with dlq-replay-count 1.
	again := []string{"BILLING_DLQ_REPLAY_GROUP_ID=" + w.group + ".replay-again"}
	out, err = w.replay(t, again)
	if err != nil {
		t.Fatalf("second replay: %v\n%s", err, out)
	}
	wantRow(t, out, "total", outage+copies, 3, 0)
	out, err = w.replay(t, again, "--reason", "permanent")
	if err != nil {
		t.Fatalf("second replay of the declined: %v\n%s", err, out)
	}
	wantRow(t, out, "total", 3, 0, 0)
	w.waitDrained(t, p, 2*time.Minute)

	// 3. With a limit of one replay, the declined records that came back
	// stop the replay, run after run.
	limited := append(again, "BILLING_DLQ_MAX_REPLAYS=1")
	for range 2 {
		out, err = w.replay(t, limited, "--reason", "permanent")
		if err == nil || !regexp.MustCompile(`refused record \S+/0@\d+: dlq-replay-count 1 has reached the limit of 1 replays`).MatchString(out) {
			t.Fatalf("replay past the limit: %v, want a refusal\n%s", err, out)
		}
		if strings.Contains(out, "REASON") {
			t.Errorf("a summary table before the failure:\n%s", out)
		}
	}
	t.Logf("replay past the limit:\n%s", out)

	replayed := map[string]int{}
	for _, rec := range w.readTopicRecords(t) {
		replayed[rec]++
	}
	// Both replays republished records that had never been replayed.
	if want := map[string]int{"": orders, "1": (outage + copies) + (3 + outage + copies)}; fmt.Sprint(replayed) != fmt.Sprint(want) {
		t.Errorf("source topic records by dlq-replay-count: %v, want %v", replayed, want)
	}

	events := scrapeEvents(t, metricsAddr)
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	rep := w.verify(t, plan, first, orders)
	report(t, rep)
	// Each charge exactly once, whatever came twice or thrice; the charged
	// events were recognised as duplicates before any payment call.
	if events["charged"] != orders-3 {
		t.Errorf("billing_events_total{result=charged} = %d, want %d", events["charged"], orders-3)
	}
	if want := copies + (outage + copies); events["duplicate"] < want {
		t.Errorf("billing_events_total{result=duplicate} = %d, want at least %d", events["duplicate"], want)
	}
	t.Logf("events %v; provider charges %d, stored answers replayed %d", events, rep.ProviderCharges, w.sim.Replays())
}

// splitByOrder splits records into those of orders below limit and the
// rest, each in its original order.
func splitByOrder(records []kafka.Message, limit int64) (below, rest []kafka.Message) {
	for _, m := range records {
		if n, _ := strconv.ParseInt(string(m.Key), 10, 64); n < limit {
			below = append(below, m)
		} else {
			rest = append(rest, m)
		}
	}
	return below, rest
}

func orderOf(t *testing.T, m kafka.Message) int64 {
	t.Helper()
	n, err := strconv.ParseInt(string(m.Key), 10, 64)
	if err != nil {
		t.Fatalf("record key %q is not an order id", m.Key)
	}
	return n
}

// replay runs `billing-consumer dlq replay args...` to its end, without
// database or provider settings (it needs neither), and returns its
// stdout followed by its last stderr line (the error, if any).
func (w *world) replay(t *testing.T, extraEnv []string, args ...string) (string, error) {
	t.Helper()
	var env []string
	for _, kv := range w.env(extraEnv...) {
		if !strings.HasPrefix(kv, "BILLING_DATABASE_URL=") && !strings.HasPrefix(kv, "BILLING_PAYMENT_URL=") {
			env = append(env, kv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.bin, append([]string{"dlq", "replay"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = io.MultiWriter(&stderr, w.log)
	err := cmd.Run()
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	return stdout.String() + lines[len(lines)-1] + "\n", err
}

// wantRow checks one line of the replay summary.
func wantRow(t *testing.T, out, reason string, replayed, notSelected, refused int) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == reason {
			if got := strings.Join(f[1:], " "); got != fmt.Sprintf("%d %d %d", replayed, notSelected, refused) {
				t.Errorf("summary %s: replayed not_selected refused = %s, want %d %d %d\n%s", reason, got, replayed, notSelected, refused, out)
			}
			return
		}
	}
	t.Errorf("summary has no %s line:\n%s", reason, out)
}

// dlqCount counts the DLQ records of reason.
func (w *world) dlqCount(t *testing.T, reason dlq.Reason) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := harness.ReadAll(ctx, w.brokers, w.dlqTopic)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		if r.Reason == reason {
			n++
		}
	}
	return n
}

// readTopicRecords returns the dlq-replay-count header of every record of
// the source topic ("" when it has none).
func (w *world) readTopicRecords(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, m := range kafkatest.MustReadTopic(t, w.brokers, w.topic) {
		count := ""
		for _, h := range m.Headers {
			if h.Key == dlq.HeaderReplayCount {
				count = string(h.Value)
			}
		}
		out = append(out, count)
	}
	return out
}

// scrapeEvents reads billing_events_total by result from /metrics.
func scrapeEvents(t *testing.T, addr string) map[string]int {
	t.Helper()
	families, err := harness.Scrape(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for result, v := range harness.CounterBy(families["billing_events_total"], "result") {
		out[result] = int(v)
	}
	return out
}
