package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// previousRelease is the commit of the release this build replaces: move
// it forward at every release, so that TestUpgradeFromPreviousRelease
// tests the upgrade that will actually be rolled out.
const previousRelease = "d454b3f"

// buildPrevious builds billing-consumer at commit (from this repository's
// history, with git archive) into ~/.cache/billing-consumer/prev-COMMIT,
// once, and returns the binary and its schema level (its highest
// migration).
func buildPrevious(t *testing.T, commit string) (string, int64) {
	t.Helper()
	names, err := exec.Command("git", "ls-tree", "--name-only", commit, "../db/migrations/").Output()
	if err != nil {
		t.Fatalf("commit %s is not in this clone's history (git ls-tree: %v): the upgrade test needs it", commit, err)
	}
	var level int64
	for _, n := range strings.Fields(string(names)) {
		base := filepath.Base(n)
		if i := strings.IndexByte(base, '_'); i > 0 && strings.HasSuffix(base, ".sql") {
			v, err := strconv.ParseInt(base[:i], 10, 64)
			if err == nil {
				level = max(level, v)
			}
		}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(home, ".cache", "billing-consumer", "prev-"+commit)
	bin := filepath.Join(dir, "billing-consumer")
	if _, err := os.Stat(bin); err == nil {
		return bin, level
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `git archive "$1" | tar -x -C "$2"`, "sh", commit, src)
	archive.Dir = ".." // git archive in a subdirectory archives only that subdirectory
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := bin + ".tmp"
	build := exec.Command("go", "build", "-o", tmp, "./cmd/billing-consumer")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil { // whole, or not at all
		t.Fatal(err)
	}
	return bin, level
}

// TestUpgradeFromPreviousRelease rolls the previous release (built from
// git) over to this build the way docs/operations.md (Upgrade) says its
// schema step must be rolled out, and checks SPEC §9 across it:
//
//   - when this build's migrations still accept the previous release's
//     binaries (LowestCompatible <= its level): a rolling upgrade. The old
//     replica keeps billing while migrate runs and while this build's
//     replica joins its group; this build's replica is SIGKILLed and
//     restarted under traffic;
//   - otherwise: stop-then-start. The old replica is stopped before
//     migrate, and this build bills what it left.
//
// Parking and deferrals are in play (BILLING_PARK_AFTER=6s for both
// binaries): four orders of the second plan fail at the provider for 30 s
// while it charges the others, and each gets a second, distinct event
// under another key a second later, which waits on the failing claim and
// is deferred (by this build; the previous one waits). This build's
// replica is SIGKILLed under traffic at 3 s, and again at 20 s, while they
// are parked and deferred (a kill restarts the failing clock of the
// events it held: parking comes 6 s after the rejoin).
// Either way every order is charged exactly once and nothing is left:
// no claim pending, no deferred event undecided.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end upgrade test; runs in make test")
	}
	prevBin, prevLevel := buildPrevious(t, previousRelease)
	rolling := migrations.LowestCompatible() <= prevLevel
	t.Logf("previous release %s (schema level %d), this build level %d accepting binaries from level %d: %s",
		previousRelease, prevLevel, migrations.Level(), migrations.LowestCompatible(),
		map[bool]string{true: "rolling upgrade", false: "stop-then-start"}[rolling])

	w := newWorldFor(t, buildBinary(t), kafkatest.Brokers(t), pgtest.NewDatabase(t), 3, paysim.Faults{ErrorRate: 0.05})
	w.extraEnv = []string{"BILLING_PARK_AFTER=6s", "BILLING_OUTAGE_AFTER=6s"}
	ctx := context.Background()
	for _, cmd := range []string{"migrate", "retention"} {
		if out, err := w.runWith(t, prevBin, cmd); err != nil {
			t.Fatalf("%s of %s: %v\n%s", cmd, previousRelease, err, out)
		}
	}
	first := time.Now().UnixMilli()*10 + 9
	plan1 := mustPlan(t, harness.Spec{Orders: 500, FirstOrderID: first, DuplicateRate: 0.1, SecondEvents: 10, Seed: 51, Now: time.Now()})
	plan2 := mustPlan(t, harness.Spec{Orders: 1500, FirstOrderID: first + 500, DuplicateRate: 0.1, SecondEvents: 20, Seed: 52, Now: time.Now()})
	if err := harness.Produce(ctx, w.brokers, w.topic, plan1.Records); err != nil {
		t.Fatal(err)
	}
	old := w.startReplica(t, prevBin, "previous")
	w.waitDrained(t, old.Process, 2*time.Minute)

	if !rolling {
		if err := old.Stop(30 * time.Second); err != nil {
			t.Fatalf("stop the previous release: %v", err)
		}
	}
	if out, err := w.migrateWith(t, w.bin); err != nil {
		t.Fatalf("migrate of this build after %s: %v\n%s", previousRelease, err, out)
	}
	failing, seconds := map[int64]bool{}, []kafka.Message(nil)
	for _, r := range plan2.Records[:4] {
		failing[orderOf(t, r)] = true
		seconds = append(seconds, secondEvent(t, r))
	}
	var recovered atomic.Bool
	w.sim.SetFaults(paysim.Faults{ErrorRate: 0.05, Unavailable: func(o int64) bool { return failing[o] && !recovered.Load() }})
	start := time.Now()
	trickle := make(chan error, 1)
	// The trickle lasts some 25 s (20 records every 300 ms), past the
	// first kill's rejoin plus BILLING_PARK_AFTER: a failing event is
	// parked only while other events are charged beside it (alone, it is
	// an outage), and at 100 records a chunk the trickle ended at about
	// 5 s, so that a slow rejoin on a loaded machine left nothing parked.
	go func() { trickle <- harness.Trickle(ctx, w.brokers, w.topic, plan2.Records, 20, 300*time.Millisecond) }()
	cur := w.startReplica(t, w.bin, "current")
	logs := []string{cur.log}
	time.Sleep(time.Second)
	if err := harness.Produce(ctx, w.brokers, w.topic, seconds); err != nil {
		t.Fatal(err)
	}
	// Kill this build's replica under traffic, and once more while the
	// failing orders are parked and their second events deferred; the
	// previous release's replica keeps billing beside it in a rolling
	// upgrade (it would refuse to start on a breaking schema: it is never
	// restarted).
	for i, at := range []time.Duration{3 * time.Second, 20 * time.Second} {
		time.Sleep(time.Until(start.Add(at)))
		cur.Kill()
		cur = w.startReplica(t, w.bin, "current-"+strconv.Itoa(i+1))
		logs = append(logs, cur.log)
	}
	if err := <-trickle; err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start.Add(30 * time.Second)))
	recovered.Store(true)
	w.waitDrained(t, cur.Process, 3*time.Minute)
	w.waitSettled(t, cur.Process)
	poll.Until(t, time.Minute, "every deferred event decided", func() bool {
		return w.count(t, "SELECT count(*) FROM deferred_event") == 0
	})
	parked := w.count(t, "SELECT count(*) FROM charge WHERE parked_at IS NOT NULL")
	deferred := len(loggedIn(t, deferredLogLine, logs...))
	t.Logf("parked claims: %d; events deferred by this build: %d", parked, deferred)
	if parked == 0 {
		t.Errorf("no claim was parked: parking was not in play")
	}
	report(t, w.verify(t, joinPlans(plan1, plan2), first, 2000))
	if rolling {
		if exited, err := old.Exited(); exited {
			t.Errorf("the previous release exited during the rolling upgrade: %v", err)
		}
		if err := old.Stop(30 * time.Second); err != nil {
			t.Errorf("graceful stop of the previous release: %v", err)
		}
	}
	if err := cur.Stop(30 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// runWith runs bin with args to completion and returns its output.
func (w *world) runWith(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, w.env()...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
