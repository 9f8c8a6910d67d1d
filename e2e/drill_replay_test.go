package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// TestDLQReplayRunbookDrill walks docs/operations.md's "Replaying the
// DLQ" literally, step by step, on a real stack (Postgres, Kafka, the
// binary, the payment simulator) after a day with every kind of dead
// letter: invalid records, declined (permanent) orders, a conflict and
// orders exhausted in a provider outage. The runbook's commands run as
// written (kubectl exec becomes the binary with the service's settings,
// the replay Job the args of its CronJob; the example order and record are
// the drill's). Afterwards every order is charged exactly once, the
// conflict was not replayed (billing_dlq_total{reason="conflict"} did not
// move: the critical ChargeConflict page does not fire again), and no
// record but the exhausted ones is marked replayed: billing_dlq_records
// still counts them. A plain `dlq replay` once replayed every reason and
// marked the rest replayed for good.
func TestDLQReplayRunbookDrill(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end drill; runs in make test")
	}
	const orders, outage = 24, 4
	first := time.Now().UnixMilli()*10 + 7
	day := mustPlan(t, harness.Spec{Orders: orders, FirstOrderID: first, Invalid: 2, Conflicts: 1, Declined: 2, Seed: 21, Now: time.Now()})
	down := mustPlan(t, harness.Spec{Orders: outage, FirstOrderID: first + orders, Seed: 22, Now: time.Now()})
	plan := mergePlans(day, down)
	decline := func(order int64) bool { return plan.Declined[order] }
	w := newWorld(t, 2, paysim.Faults{Decline: decline})

	metrics := kafkatest.FreePort(t)
	// As in TestReplayDuplicatesAreHarmless: failures exhaust an event after
	// two attempts, the completer leaves the exhausted events' claims to the
	// replay, and the backlog gauge is read every second.
	p := w.start(t, []string{"BILLING_MAX_ATTEMPTS=2", "BILLING_RETRY_BUDGET=0", "BILLING_OUTAGE_THRESHOLD=0",
		"BILLING_OUTAGE_AFTER=0", "BILLING_COMPLETER_AFTER=1h", "BILLING_CLAIM_BLOCK_AFTER=2h",
		"BILLING_DLQ_BACKLOG_INTERVAL=1s", "BILLING_HTTP_ADDR=" + metrics}, "run")
	ctx := context.Background()
	if err := harness.Produce(ctx, w.brokers, w.topic, day.Records); err != nil {
		t.Fatal(err)
	}
	w.waitDrained(t, p, 2*time.Minute)
	w.sim.SetFaults(paysim.Faults{ErrorRate: 1, Decline: decline})
	if err := harness.Produce(ctx, w.brokers, w.topic, down.Records); err != nil {
		t.Fatal(err)
	}
	w.waitDrained(t, p, 2*time.Minute)
	w.sim.SetFaults(paysim.Faults{Decline: decline})

	before := w.dlqList(t)
	byReason := map[dlq.Reason]int{}
	for _, e := range before {
		byReason[dlq.Reason(e.Reason)]++
	}
	if byReason[dlq.Exhausted] != outage || byReason[dlq.Invalid] != 2 || byReason[dlq.Permanent] != 2 || byReason[dlq.Conflict] != 1 {
		t.Fatalf("dead letters before the drill %v, want %d exhausted, 2 invalid, 2 permanent, 1 conflict", byReason, outage)
	}
	conflictsBefore := scrapeCounter(t, metrics, "billing_dlq_total", "reason")["conflict"]
	example := before[slices.IndexFunc(before, func(e drillEntry) bool { return e.Reason == "exhausted" })]

	for _, step := range runbookSteps(t) {
		w.drillStep(t, step, example)
	}

	w.waitDrained(t, p, 2*time.Minute)
	w.waitSettled(t, p)
	after := w.dlqList(t)
	for _, e := range after {
		if want := e.Reason == "exhausted"; e.Replayed != want {
			t.Errorf("%s record %d@%d of order %d: replayed %t, want %t", e.Reason, e.Partition, e.Offset, e.OrderID, e.Replayed, want)
		}
	}
	if len(after) != len(before) {
		t.Errorf("the DLQ holds %d records after the drill, %d before: a replayed record failed again", len(after), len(before))
	}
	if n := scrapeCounter(t, metrics, "billing_dlq_total", "reason")["conflict"]; n != conflictsBefore {
		t.Errorf(`billing_dlq_total{reason="conflict"} went from %v to %v: a conflict was replayed and pages again`, conflictsBefore, n)
	}
	// The records not replayed are still the backlog the retention alert
	// watches.
	notReplayed := float64(len(before) - outage)
	poll.Until(t, time.Minute, "billing_dlq_records to count the records not replayed", func() bool {
		return scrapeGauge(t, metrics, "billing_dlq_records") == notReplayed
	})
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	rep := w.verify(t, plan, first, orders+outage)
	report(t, rep)
}

// drillEntry is a line of `dlq list --json`.
type drillEntry struct {
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	Reason    string `json:"reason"`
	OrderID   int64  `json:"order_id"`
	Replayed  bool   `json:"replayed"`
}

// dlqList is `billing-consumer dlq list --json`.
func (w *world) dlqList(t *testing.T) []drillEntry {
	t.Helper()
	out := w.oneShot(t, "dlq", "list", "--json")
	var entries []drillEntry
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e drillEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("dlq list --json line %q: %v", line, err)
		}
		entries = append(entries, e)
	}
	return entries
}

// oneShot runs the binary with the service's settings, as `kubectl exec`
// into a consumer pod does, and returns its stdout; it fails the test on a
// non-zero exit.
func (w *world) oneShot(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, w.env()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("billing-consumer %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// runbookSteps returns the command lines of the fenced blocks of "Replaying
// the DLQ" in docs/operations.md, in order.
func runbookSteps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "**Replaying the DLQ**")
	section, _, ok2 := strings.Cut(section, "\n### ")
	if !ok || !ok2 {
		t.Fatal(`docs/operations.md has no "Replaying the DLQ" procedure before the next runbook`)
	}
	var steps []string
	fenced := false
	for _, line := range strings.Split(section, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "```"):
			fenced = !fenced
		case fenced && line != "" && !strings.HasPrefix(line, "#"):
			steps = append(steps, line)
		}
	}
	if len(steps) < 5 {
		t.Fatalf("found %d steps in the DLQ replay procedure, want its commands:\n%s", len(steps), section)
	}
	return steps
}

// drillStep carries out one runbook line: the binary's commands with the
// service's settings (the example order 1001 and record 0@42 become the
// drill's), a Job from its CronJob's args, and kubectl's wait and logs,
// which the synchronous run makes moot. A line it does not know fails the
// drill: the runbook changed, and so must the drill.
func (w *world) drillStep(t *testing.T, line string, example drillEntry) {
	t.Helper()
	const exec = "kubectl -n billing exec deploy/billing-consumer -- /billing-consumer "
	var args []string
	switch {
	case strings.HasPrefix(line, exec):
		args = strings.Fields(strings.TrimPrefix(line, exec))
		for i, a := range args {
			switch {
			case a == "1001":
				args[i] = strconv.FormatInt(example.OrderID, 10)
			case a == "0" && i > 0 && args[i-1] == "--partition":
				args[i] = strconv.Itoa(example.Partition)
			case a == "42" && i > 0 && args[i-1] == "--offset":
				args[i] = strconv.FormatInt(example.Offset, 10)
			}
		}
	case strings.HasPrefix(line, "kubectl -n billing create job --from=cronjob/"):
		name := strings.Fields(strings.TrimPrefix(line, "kubectl -n billing create job --from=cronjob/"))[0]
		args = cronJobArgs(t, name)
	case strings.HasPrefix(line, "kubectl -n billing wait ") || strings.HasPrefix(line, "kubectl -n billing logs "):
		t.Logf("drill: %s (the step before ran to its end)", line)
		return
	default:
		t.Fatalf("drill: the runbook has a step the drill does not know: %q", line)
	}
	out := w.oneShot(t, args...)
	t.Logf("drill: %s\n$ billing-consumer %s\n%s", line, strings.Join(args, " "), out)
	if slices.Equal(args, []string{"dlq", "replay", "--dry-run"}) {
		wantRow(t, out, "exhausted", 4, 0, 0)
		wantRow(t, out, "conflict", 0, 1, 0)
		wantRow(t, out, "total", 4, 5, 0)
	}
}

// cronJobArgs reads the args of deploy/base/cronjob-<name minus the
// billing-consumer- prefix>.yaml.
func cronJobArgs(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile("../deploy/base/cronjob-" + strings.TrimPrefix(name, "billing-consumer-") + ".yaml")
	if err != nil {
		t.Fatalf("the runbook names CronJob %s: %v", name, err)
	}
	m := regexp.MustCompile(`(?m)^\s+args: \[(.*)\]$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("CronJob %s has no args line", name)
	}
	var args []string
	for _, a := range strings.Split(string(m[1]), ",") {
		s, err := strconv.Unquote(strings.TrimSpace(a))
		if err != nil {
			t.Fatalf("CronJob %s args %s: %v", name, m[1], err)
		}
		args = append(args, s)
	}
	return args
}

// mergePlans is the plan of both workloads.
func mergePlans(a, b harness.Plan) harness.Plan {
	out := a
	out.Records = append(slices.Clone(a.Records), b.Records...)
	out.Charged, out.Declined, out.Events = maps.Clone(a.Charged), maps.Clone(a.Declined), maps.Clone(a.Events)
	maps.Copy(out.Charged, b.Charged)
	maps.Copy(out.Declined, b.Declined)
	maps.Copy(out.Events, b.Events)
	return out
}

// scrapeCounter reads a counter family by label from /metrics.
func scrapeCounter(t *testing.T, addr, family, label string) map[string]float64 {
	t.Helper()
	families, err := harness.Scrape(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return harness.CounterBy(families[family], label)
}

// scrapeGauge reads an unlabelled gauge from /metrics (-1 when absent).
func scrapeGauge(t *testing.T, addr, family string) float64 {
	t.Helper()
	families, err := harness.Scrape(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	f := families[family]
	if f == nil || len(f.Metric) != 1 || f.Metric[0].Gauge == nil {
		return -1
	}
	return f.Metric[0].Gauge.GetValue()
}
