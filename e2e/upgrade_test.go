package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// buildNext compiles billing-consumer with the extra migrations (file
// name to SQL) added to db/migrations through go build -overlay: the
// binary of the next release, as far as the schema is concerned.
func buildNext(t *testing.T, extra map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	migDir, err := filepath.Abs("../db/migrations")
	if err != nil {
		t.Fatal(err)
	}
	replace := map[string]string{}
	for name, sql := range extra {
		src := filepath.Join(dir, name)
		if err := os.WriteFile(src, []byte(sql), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(migDir, name)] = src
	}
	ov, _ := json.Marshal(map[string]any{"Replace": replace})
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "billing-consumer-next")
	if out, err := exec.Command("go", "build", "-overlay", ovPath, "-o", bin, "../cmd/billing-consumer").CombinedOutput(); err != nil {
		t.Fatalf("build the next binary: %v\n%s", err, out)
	}
	return bin
}

// replica is one billing-consumer process of the upgrade test, with its
// own log and ops address.
type replica struct {
	*harness.Process
	addr string
	log  string
}

func (w *world) startReplica(t *testing.T, bin, name string) *replica {
	t.Helper()
	r := &replica{addr: kafkatest.FreePort(t), log: filepath.Join(t.TempDir(), name+".log")}
	f, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r.Process, err = harness.Start(bin, []string{"run"}, w.env("BILLING_HTTP_ADDR="+r.addr), f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Kill)
	return r
}

// lines returns the log lines of r that contain s.
func (r *replica) lines(t *testing.T, s string) []string {
	t.Helper()
	b, err := os.ReadFile(r.log)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// migrateWith runs bin migrate with args and returns its output and error.
func (w *world) migrateWith(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	return w.runWith(t, bin, append([]string{"migrate"}, args...)...)
}

// TestSchemaGuard walks a release through the schema compatibility guard
// (docs/operations.md, Upgrade) with the real binaries: this build (level
// L) and "next" builds of it with an extra additive migration (lowest
// compatible binary unchanged) and then a breaking one (lowest compatible
// binary raised to its own level):
//
//  1. after the additive migration, a replica of this build started on the
//     newer schema bills (a rolling upgrade may restart old pods);
//  2. migrate of the breaking step is refused while replicas of this build
//     run, and changes nothing;
//  3. with --allow-breaking it is applied, and the running replicas stop
//     billing at their next heartbeat: unready, one log line, no charge
//     and no offset commit for the orders produced after;
//  4. a replica of this build started on that schema does not bill either
//     (unready, one line);
//  5. the next build bills what they left, every order exactly once.
func TestSchemaGuard(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end upgrade test; runs in make test")
	}
	w := newWorld(t, 3, paysim.Faults{})
	ctx := context.Background()
	const additive, breaking = "00998_next_additive.sql", "00999_next_breaking.sql"
	next1 := buildNext(t, map[string]string{additive: nextAdditive})
	next2 := buildNext(t, map[string]string{additive: nextAdditive, breaking: nextBreaking})

	first := time.Now().UnixMilli()*10 + 7
	plans := make([]harness.Plan, 3)
	for i := range plans {
		plans[i] = mustPlan(t, harness.Spec{Orders: 300, FirstOrderID: first + int64(300*i), DuplicateRate: 0.1, Seed: uint64(40 + i), Now: time.Now()})
	}
	produce := func(p harness.Plan) {
		t.Helper()
		if err := harness.Produce(ctx, w.brokers, w.topic, p.Records); err != nil {
			t.Fatal(err)
		}
	}

	produce(plans[0])
	old1 := w.startReplica(t, w.bin, "old1")
	w.waitDrained(t, old1.Process, 2*time.Minute)

	// 1. An additive step: applied while old1 runs; a replica of this
	// build started afterwards bills on the newer schema.
	if out, err := w.migrateWith(t, next1); err != nil {
		t.Fatalf("migrate of an additive step: %v\n%s", err, out)
	}
	old2 := w.startReplica(t, w.bin, "old2")
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err := old2.WaitReady(rctx, old2.addr)
	cancel()
	if err != nil {
		_, body := opsGet(t, "http://"+old2.addr+"/readyz")
		t.Fatalf("this build on a newer schema that accepts it: %v (/readyz: %s)", err, body)
	}
	produce(plans[1])
	w.waitDrained(t, old2.Process, 2*time.Minute)

	// 2. The breaking step is refused while old1 and old2 run.
	out, err := w.migrateWith(t, next2)
	if err == nil || !strings.Contains(out, "breaks binaries below schema level 999") || strings.Count(out, "(level ") != 2 {
		t.Fatalf("migrate of a breaking step while 2 older replicas run: err %v, want a refusal naming both:\n%s", err, out)
	}
	t.Logf("migrate refused: %s", lastLine(out))
	if n := w.count(t, `SELECT count(*) FROM pg_tables WHERE tablename = 'next_release_probe'`); n != 0 {
		t.Fatal("the refused migration was applied anyway")
	}

	// 3. Forced: both stop billing, say why, and commit nothing new.
	if out, err := w.migrateWith(t, next2, "--allow-breaking"); err != nil {
		t.Fatalf("migrate --allow-breaking: %v\n%s", err, out)
	}
	for _, r := range []*replica{old1, old2} {
		waitRefusing(t, r)
	}
	committed := w.committedSum(t)
	produce(plans[2])
	// 4. A replica of this build started now does not bill either.
	old3 := w.startReplica(t, w.bin, "old3")
	waitRefusing(t, old3)
	if n := len(old3.lines(t, `"step":"the schema"`)); n != 1 {
		t.Errorf("the replica started on a schema that refuses it logged the schema step %d times, want one line", n)
	}
	// Nothing may happen now: give every replica one and a half
	// heartbeats (migrations.HeartbeatInterval, 10s) to misbehave.
	time.Sleep(15 * time.Second)
	lo, hi := first+600, first+900
	if n := w.count(t, `SELECT count(*) FROM charge WHERE order_id >= $1 AND order_id < $2`, lo, hi); n != 0 {
		t.Errorf("%d orders charged on a schema that does not accept this build", n)
	}
	if c := w.committedSum(t); c != committed {
		t.Errorf("committed offsets moved from %d to %d on a schema that does not accept this build", committed, c)
	}
	for _, r := range []*replica{old1, old2} {
		if n := len(r.lines(t, "the schema no longer accepts this binary")); n != 1 {
			t.Errorf("%s logged the refusal %d times, want one line", r.log, n)
		}
	}

	// 5. The next build takes over and bills the rest.
	nxt := w.startReplica(t, next2, "next")
	w.waitDrained(t, nxt.Process, 2*time.Minute)
	report(t, w.verify(t, joinPlans(joinPlans(plans[0], plans[1]), plans[2]), first, 900))
	// old3 never got past its startup: a SIGTERM then exits 1, by design
	// (it stopped before it was ready), so only the others are checked.
	old3.Kill()
	for _, r := range []*replica{old1, old2, nxt} {
		if err := r.Stop(30 * time.Second); err != nil {
			t.Errorf("graceful stop of %s: %v", r.log, err)
		}
	}
}

const nextAdditive = `-- +goose Up
-- lowest-compatible-binary: 3
CREATE TABLE next_release_note (note text);
-- +goose Down
DROP TABLE next_release_note;
`

const nextBreaking = `-- +goose Up
-- lowest-compatible-binary: 999
CREATE TABLE next_release_probe (x int);
-- +goose Down
DROP TABLE next_release_probe;
`

// waitRefusing waits until r's /readyz says it refuses to bill.
func waitRefusing(t *testing.T, r *replica) {
	t.Helper()
	pollOps(t, 60*time.Second, r.log+": /readyz to refuse the schema", func() string {
		code, body := opsGet(t, "http://"+r.addr+"/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "refusing to bill") {
			return ""
		}
		return fmt.Sprintf("%d %q", code, strings.TrimSpace(body))
	})
}

func (w *world) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.db.QueryRow(qctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// committedSum is the sum of the group's committed offsets.
func (w *world) committedSum(t *testing.T) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lags, err := harness.Lag(ctx, w.brokers, w.topic, w.group)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, l := range lags {
		sum += max(l.Committed, 0)
	}
	return sum
}
