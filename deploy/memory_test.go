package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The memory model of docs/operations.md ("Memory"), as the manifests must
// satisfy it. The fractions are those of cmd/billing-consumer/memlimit.go
// (the binary is run below to confirm it accepts the result); the
// per-partition and fixed costs are the measured ones (docs/operations.md
// gives the measurements, make bench's partition sweep the evidence).
const (
	// modelPartitions is the most partitions one replica was measured
	// owning (the bench's partition sweep): a Deployment scaled down to
	// one replica hands it every partition of the topic.
	modelPartitions = 160
	// modelPerPartition is what an owned partition holds outside the
	// budget: its connection's buffers and its goroutines (a heap profile
	// at 160 partitions: about 26 KiB a partition; 96 KiB was kafka-go's
	// reader's, kept as the margin).
	modelPerPartition = 96 << 10
	// modelFixed is the rest: the handlers' working memory at
	// BILLING_CONCURRENCY=1024 (decoded events, requests, batches), the
	// pools, the runtime and the binary.
	modelFixed = 64 << 20
	// defaultRecordBytes is BILLING_KAFKA_MAX_RECORD_BYTES's default.
	defaultRecordBytes = 1 << 20
	recordOverhead     = 512 // consumer.RecordOverhead
)

// TestMemoryModelFitsThePod checks, for the consumer Deployment of the base
// and of every overlay, that its memory limit, its GOMEMLIMIT and its
// in-flight budget (BILLING_MAX_INFLIGHT_BYTES, 0: a thirty-second of
// GOMEMLIMIT) agree: the budget holds one maximal record, is at most a
// quarter of GOMEMLIMIT (what the binary enforces), and twice the budget
// and modelPartitions partitions (the heap they cost) plus the fixed costs
// fit in GOMEMLIMIT; and
// that the bench's partition sweep runs with the base's GOMEMLIMIT. Then it
// runs the binary with the pod's GOMEMLIMIT and ConfigMap: it must not
// reject the budget, and must reject it when GOMEMLIMIT is too small for
// it (so the first check is not vacuous).
func TestMemoryModelFitsThePod(t *testing.T) {
	var bin string
	if !testing.Short() {
		bin = buildConsumer(t)
	}
	for _, dir := range kustomizations(t) {
		b := render(t, dir)
		for _, pt := range podTemplates(t, b) {
			if len(pt.args) != 1 || pt.args[0] != "run" {
				continue
			}
			c := pt.spec.Spec.Containers[0]
			where := dir + ": " + pt.owner
			env := config(t, b, c)
			gomem, err := parseGoMemLimit(envValue(c, "GOMEMLIMIT"))
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			budget, record := intVar(t, where, env, "BILLING_MAX_INFLIGHT_BYTES", 0), intVar(t, where, env, "BILLING_KAFKA_MAX_RECORD_BYTES", defaultRecordBytes)
			if budget == 0 {
				budget = gomem / 32
			}
			// The heap the budget, the fetched responses being decoded
			// (a quarter of the budget's maximal records at once, at
			// least one, each up to four maximal records: see
			// internal/consumer's fetchSlots) and the partitions cost is
			// about twice what they hold (GOGC).
			decoding := max(1, budget/(4*(record+recordOverhead))) * 4 * (record + recordOverhead)
			need := 2*(budget+decoding+modelPartitions*modelPerPartition) + modelFixed
			switch {
			case budget < record+recordOverhead:
				t.Errorf("%s: in-flight budget %d cannot hold one maximal record of %d bytes", where, budget, record)
			case budget > gomem/4:
				t.Errorf("%s: in-flight budget %d is more than a quarter of GOMEMLIMIT (%d)", where, budget, gomem)
			case need > gomem:
				t.Errorf("%s: the memory model needs %d MiB at %d partitions (twice the budget of %d MiB, %d MiB decoding and %d KiB a partition, %d MiB fixed), GOMEMLIMIT is %d MiB",
					where, need>>20, modelPartitions, budget>>20, decoding>>20, modelPerPartition>>10, modelFixed>>20, gomem>>20)
			}
			t.Logf("%s: limit %s, GOMEMLIMIT %d MiB, budget %.1f MiB; the model needs %d MiB at %d partitions",
				where, c.Resources.Limits.Memory().String(), gomem>>20, float64(budget)/(1<<20), need>>20, modelPartitions)
			if dir == "base" {
				checkBenchMemLimit(t, envValue(c, "GOMEMLIMIT"))
			}
			if bin != "" {
				checkBinaryAccepts(t, bin, where, env, envValue(c, "GOMEMLIMIT"))
			}
		}
	}
}

// envValue is the value of the container's variable name.
func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// intVar is the ConfigMap's integer name, or def when it is not set.
func intVar(t *testing.T, where string, env map[string]string, name string, def int64) int64 {
	t.Helper()
	s, ok := env[name]
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Errorf("%s: %s=%q is not an integer", where, name, s)
	}
	return n
}

// checkBenchMemLimit checks that the bench's partition sweep runs with
// the base Deployment's GOMEMLIMIT.
func checkBenchMemLimit(t *testing.T, gomemlimit string) {
	t.Helper()
	src, err := os.ReadFile("../cmd/billing-bench/partsweep.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`podGoMemLimit = "([^"]+)"`).FindSubmatch(src)
	if m == nil || string(m[1]) != gomemlimit {
		t.Errorf("cmd/billing-bench/partsweep.go's podGoMemLimit is %q, the base Deployment's GOMEMLIMIT %q: keep them equal", m, gomemlimit)
	}
}

// checkBinaryAccepts runs `billing-consumer run` with the pod's ConfigMap
// and GOMEMLIMIT and nothing else: it stops at once on the required
// variables it lacks, listing every problem, and none may be about the
// budget. With a GOMEMLIMIT far too small for the budget it must name it.
func checkBinaryAccepts(t *testing.T, bin, where string, cm map[string]string, gomemlimit string) {
	t.Helper()
	problems := func(gomem string) string {
		env := []string{"GOMEMLIMIT=" + gomem, "PATH=" + os.Getenv("PATH")}
		for k, v := range cm {
			env = append(env, k+"="+v)
		}
		cmd := exec.Command(bin, "run")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("%s: billing-consumer run without brokers, database and provider succeeded", where)
		}
		return string(out)
	}
	budgetVars := regexp.MustCompile(`BILLING_(MAX_INFLIGHT_BYTES|KAFKA_MAX_RECORD_BYTES)`)
	if out := problems(gomemlimit); budgetVars.MatchString(out) || !strings.Contains(out, "BILLING_DATABASE_URL") {
		t.Errorf("%s: with the pod's GOMEMLIMIT=%s and ConfigMap, billing-consumer run said:\n%s\nwant only the missing required variables", where, gomemlimit, out)
	}
	if out := problems("8MiB"); !strings.Contains(out, "BILLING_MAX_INFLIGHT_BYTES") {
		t.Errorf("%s: with GOMEMLIMIT=8MiB, billing-consumer run said:\n%s\nwant it to reject BILLING_MAX_INFLIGHT_BYTES", where, out)
	}
}

// buildConsumer builds billing-consumer into the test's directory.
func buildConsumer(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "billing-consumer")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/billing-consumer")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build billing-consumer: %v\n%s", err, out)
	}
	return bin
}
