package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// orderRecord is a valid order.confirmed record for order, with a fresh
// event id.
func orderRecord(order int64, amount string) (kafka.Message, uuid.UUID) {
	id := uuid.Must(uuid.NewV7())
	b, _ := json.Marshal(map[string]any{"event_id": id.String(), "event_type": "order.confirmed.v1",
		"occurred_at": time.Now().UTC().Format(time.RFC3339), "order_id": order, "customer_id": 42, "total_amount": amount})
	return kafka.Message{Key: []byte(strconv.FormatInt(order, 10)), Value: b}, id
}

// command runs a one-shot command of the binary with the world's
// environment and returns its stdout; stderr (the JSON log) goes to the
// world's log.
func (w *world) command(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, w.env()...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, w.log
	err := cmd.Run()
	return out.String(), err
}

// gauge returns the value of the gauge series of family name whose labels
// include want (every series when want is empty, summed).
func gauge(t *testing.T, addr, name string, want map[string]string) (float64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	families, err := harness.Scrape(ctx, addr)
	if err != nil {
		return 0, false
	}
	var sum float64
	found := false
	for _, m := range families[name].GetMetric() {
		if labelsMatch(m, want) {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			found = true
		}
	}
	return sum, found
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(want)
}

// runbookCommands returns the billing-consumer command lines of the
// fenced code blocks of section heading in docs/operations.md, in order,
// each split into words as a shell would (double quotes only).
func runbookCommands(t *testing.T, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n### "+heading+"\n")
	if start < 0 {
		t.Fatalf("docs/operations.md has no section %s", heading)
	}
	section := doc[start+1:]
	if end := strings.Index(section[4:], "\n### "); end >= 0 {
		section = section[:end+4]
	}
	var cmds [][]string
	inBlock := false
	for _, line := range strings.Split(section, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock && strings.HasPrefix(line, "billing-consumer ") {
			cmds = append(cmds, shellWords(t, line))
		}
	}
	return cmds
}

func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	for _, m := range regexp.MustCompile(`"([^"]*)"|(\S+)`).FindAllStringSubmatch(line, -1) {
		if m[2] == "" {
			words = append(words, m[1])
		} else {
			words = append(words, m[2])
		}
	}
	return words
}

// step finds the runbook command whose first words are prefix, with the
// placeholders replaced, and without the program name.
func step(t *testing.T, cmds [][]string, prefix string, values map[string]string) []string {
	t.Helper()
	for _, c := range cmds {
		if strings.Join(c, " ") == prefix || strings.HasPrefix(strings.Join(c, " "), prefix+" ") {
			out := make([]string, 0, len(c)-1)
			for _, w := range c[1:] {
				for k, v := range values {
					w = strings.ReplaceAll(w, k, v)
				}
				out = append(out, w)
			}
			return out
		}
	}
	t.Fatalf("the runbook has no %q command; it has %q", prefix, cmds)
	return nil
}

// claimStatus is the ledger status of order, "none" without a row.
func (w *world) claimStatus(t *testing.T, order int64) (status, chargeID string) {
	t.Helper()
	err := w.db.QueryRow(context.Background(), `SELECT status, coalesce(provider_charge_id, '') FROM charge WHERE order_id = $1`, order).
		Scan(&status, &chargeID)
	if err != nil {
		return "none", ""
	}
	return status, chargeID
}

// deferredRows counts event's rows in deferred_event.
func (w *world) deferredRows(t *testing.T, event uuid.UUID) int {
	t.Helper()
	var n int
	if err := w.db.QueryRow(context.Background(), `SELECT count(*) FROM deferred_event WHERE event_id = $1`, event).Scan(&n); err != nil {
		t.Fatalf("count deferred rows: %v", err)
	}
	return n
}

// pollFor polls cond every 200ms up to timeout, failing with what.
func pollFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(200 * time.Millisecond) {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// The BillingLedgerClaimBlocked runbook, walked literally on a real stack
// (Postgres, Kafka, the provider simulator, the binary): its commands are
// read from docs/operations.md and run with the placeholders filled in.
// Order A's charge was taken by the provider after the consumer gave up on
// it (blocked, outcome unknown); order B's was never taken (blocked after
// 500s), and B's own event waits in deferred_event on its blocked claim.
// After the runbook: A is charged exactly once, with the provider's charge
// id; B's release lets its own deferred event charge it once, under its
// own key (operations.md: "A released order is charged again by the events
// kept for it"), and a later event for B is a duplicate_order; both
// decisions are in claim_audit; the blocked gauge is back at 0 and stays
// there, and no further conflict is dead-lettered (the critical pages do
// not fire again).
func TestDrillBlockedClaimRunbook(t *testing.T) {
	w := newWorld(t, 1, paysim.Faults{})
	const orderA, orderB = 9100001, 9100002
	addr := kafkatest.FreePort(t)
	p := w.start(t, []string{"BILLING_HTTP_ADDR=" + addr, "BILLING_PAYMENT_TIMEOUT=1s", "BILLING_CLAIM_BLOCK_AFTER=6s",
		"BILLING_OUTAGE_AFTER=5m", "BILLING_OUTAGE_THRESHOLD=0", "BILLING_PARK_AFTER=5m",
		// The operator waits for a claim's last send's deadline (1s + 3s)
		// plus this bound: both orders' last sends are long over when the
		// runbook runs (SPEC §11 I5).
		"BILLING_DB_TIMEOUT=3s", "BILLING_PROVIDER_MAX_PROCESSING=1s"}, "run")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := p.WaitReady(ctx, addr); err != nil {
		t.Fatal(err)
	}

	// B: the provider fails every request (500, nothing taken) until the
	// claim is blocked.
	w.sim.SetFaults(paysim.Faults{ErrorRate: 1})
	recB, eventB := orderRecord(orderB, "12.50")
	if err := harness.Produce(ctx, w.brokers, w.topic, []kafka.Message{recB}); err != nil {
		t.Fatal(err)
	}
	pollFor(t, 2*time.Minute, "order B's claim blocked", func() bool { st, _ := w.claimStatus(t, orderB); return st == "blocked" })
	pollFor(t, time.Minute, "order B's own event deferred on its blocked claim", func() bool { return w.deferredRows(t, eventB) == 1 })
	// A: the provider takes the charge only after 20s, long after the
	// client's 1s timeout and the 6s block limit.
	w.sim.SetFaults(paysim.Faults{Latency: 20 * time.Second})
	recA, eventA := orderRecord(orderA, "99.90")
	if err := harness.Produce(ctx, w.brokers, w.topic, []kafka.Message{recA}); err != nil {
		t.Fatal(err)
	}
	pollFor(t, 2*time.Minute, "order A's claim blocked", func() bool { st, _ := w.claimStatus(t, orderA); return st == "blocked" })
	w.sim.SetFaults(paysim.Faults{})
	pollFor(t, time.Minute, "the provider to take A's delayed charge", func() bool { return w.sim.ChargesFor(orderA) == 1 })
	pollFor(t, 30*time.Second, "billing_ledger_claims{status=blocked} = 2", func() bool {
		v, _ := gauge(t, addr, "billing_ledger_claims", map[string]string{"status": "blocked"})
		return v == 2
	})
	conflictsBefore, _ := gauge(t, addr, "billing_dlq_total", map[string]string{"reason": "conflict"})

	cmds := runbookCommands(t, "BillingLedgerClaimBlocked")
	out, err := w.command(t, step(t, cmds, "billing-consumer reconcile --dry-run", nil)...)
	if err != nil || !strings.Contains(out, strconv.Itoa(orderA)) || !strings.Contains(out, strconv.Itoa(orderB)) || !strings.Contains(out, "2 blocked") {
		t.Fatalf("reconcile --dry-run: %v\n%s", err, out)
	}
	t.Logf("reconcile --dry-run:\n%s", out)
	// A: the provider holds a charge for A's key (its event id).
	var chargeA string
	for _, c := range w.sim.Charges() {
		if c.Key == eventA.String() {
			chargeA = c.ChargeID
		}
	}
	if chargeA == "" {
		t.Fatalf("the provider holds no charge for A's key %s", eventA)
	}
	for _, tc := range []struct {
		order  int64
		event  uuid.UUID
		action string
	}{
		{orderA, eventA, "billing-consumer claim mark-charged"},
		{orderB, eventB, "billing-consumer claim release"},
	} {
		values := map[string]string{"ORDER": strconv.FormatInt(tc.order, 10), "CHARGE_ID": chargeA, "TICKET": "DRILL-1", "YOU": "drill-operator"}
		out, err := w.command(t, step(t, cmds, "billing-consumer claim show", values)...)
		if err != nil || !strings.Contains(out, tc.event.String()) || !strings.Contains(out, "blocked") {
			t.Fatalf("claim show --order %d: %v\n%s", tc.order, err, out)
		}
		t.Logf("claim show --order %d:\n%s", tc.order, out)
		out, err = w.command(t, step(t, cmds, tc.action, values)...)
		if err != nil {
			t.Fatalf("%s --order %d: %v\n%s", tc.action, tc.order, err, out)
		}
		t.Logf("%s --order %d:\n%s", tc.action, tc.order, out)
	}

	if st, id := w.claimStatus(t, orderA); st != "charged" || id != chargeA {
		t.Fatalf("order A: %s %q; want charged %q", st, id, chargeA)
	}
	// B's own deferred event takes the released order at the deciding
	// loop's next pass, and charges it with its own key.
	pollFor(t, time.Minute, "order B charged by its own deferred event", func() bool {
		st, _ := w.claimStatus(t, orderB)
		return st == "charged" && w.deferredRows(t, eventB) == 0
	})
	var chargedBy uuid.UUID
	if err := w.db.QueryRow(ctx, `SELECT event_id FROM charge WHERE order_id = $1`, orderB).Scan(&chargedBy); err != nil || chargedBy != eventB {
		t.Fatalf("order B charged by event %v, %v; want its own event %v", chargedBy, err, eventB)
	}
	var audits int
	if err := w.db.QueryRow(ctx, `SELECT count(*) FROM claim_audit WHERE operator = 'drill-operator' AND reason LIKE 'DRILL-1:%'`).Scan(&audits); err != nil || audits != 2 {
		t.Fatalf("claim_audit rows = %d, %v; want 2", audits, err)
	}
	out, err = w.command(t, step(t, cmds, "billing-consumer reconcile --dry-run", nil)...)
	if err != nil || strings.Contains(out, strconv.Itoa(orderA)) || strings.Contains(out, strconv.Itoa(orderB)) || !strings.Contains(out, "0 blocked") {
		t.Fatalf("reconcile --dry-run after the decisions: %v\n%s", err, out)
	}

	// A new event for the charged order is a duplicate_order: no charge.
	dupBefore, _ := gauge(t, addr, "billing_events_total", map[string]string{"result": "duplicate_order"})
	recB2, _ := orderRecord(orderB, "12.50")
	if err := harness.Produce(ctx, w.brokers, w.topic, []kafka.Message{recB2}); err != nil {
		t.Fatal(err)
	}
	pollFor(t, time.Minute, "order B's new event decided duplicate_order", func() bool {
		v, _ := gauge(t, addr, "billing_events_total", map[string]string{"result": "duplicate_order"})
		return v == dupBefore+1
	})
	w.waitDrained(t, p, time.Minute)
	pollFor(t, 30*time.Second, "billing_ledger_claims{status=blocked} back at 0", func() bool {
		v, ok := gauge(t, addr, "billing_ledger_claims", map[string]string{"status": "blocked"})
		return ok && v == 0
	})
	// Several completer passes (1s) later: still 0, and no new conflict.
	time.Sleep(3 * time.Second)
	blocked, _ := gauge(t, addr, "billing_ledger_claims", map[string]string{"status": "blocked"})
	conflicts, _ := gauge(t, addr, "billing_dlq_total", map[string]string{"reason": "conflict"})
	if blocked != 0 || conflicts != conflictsBefore {
		t.Fatalf("after the runbook: %v blocked claims, conflicts %v -> %v; want 0 and no new conflict", blocked, conflictsBefore, conflicts)
	}
	if a, b := w.sim.ChargesFor(orderA), w.sim.ChargesFor(orderB); a != 1 || b != 1 {
		t.Fatalf("provider charges: A %d, B %d; want exactly one each", a, b)
	}
	if d := w.sim.DoubleCharged(); len(d) > 0 {
		t.Fatalf("double charged: %v", d)
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}
