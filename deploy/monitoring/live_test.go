package monitoring

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// window is the shortest duration of the scaled rules: ten scrapes.
const (
	interval = time.Second
	window   = 10 * interval
)

// prometheusBin is the Prometheus of BILLING_TEST_PROMETHEUS (scripts/test.sh
// sets it from scripts/prometheus.sh), or the one scripts/prometheus.sh has
// cached; without either the test is skipped, except under CI.
func prometheusBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BILLING_TEST_PROMETHEUS"); p != "" {
		return p
	}
	out, err := exec.Command("../../scripts/prometheus.sh", "cached").Output()
	if p := strings.TrimSpace(string(out)); err == nil && p != "" {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Prometheus: set BILLING_TEST_PROMETHEUS (scripts/test.sh does, from scripts/prometheus.sh path)")
	}
	t.Skip("no Prometheus built: run scripts/prometheus.sh build, or set BILLING_TEST_PROMETHEUS")
	return ""
}

// buildBinary builds billing-consumer in the service's own module (with
// its go.mod's versions, not deploy/'s).
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "billing-consumer")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/billing-consumer")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestMonitoring is the live monitoring test: two replicas of the built
// binary on Kafka, Postgres and the payment simulator, a real Prometheus
// scraping them every second and evaluating the rendered PrometheusRule
// scaled by Factor, through the phases of Phases. Per phase it asserts
// exactly the expected alerts firing and the values of every dashboard
// query. With BILLING_MONITORING_REPORT=path (make monitoring-report) it
// writes the report of the run there.
func TestMonitoring(t *testing.T) {
	prom := prometheusBin(t)
	rc := RigConfig{
		Bin: buildBinary(t), Prometheus: prom, Brokers: kafkatest.Brokers(t), DBURL: pgtest.NewDatabase(t),
		Dir: t.TempDir(), RulesDir: "../base", Namespace: "billing-live", Partitions: 4, Replicas: 2,
		Interval: interval, OrdersPerSecond: 20,
	}
	logPath := filepath.Join(rc.Dir, "processes.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	rc.Log = f
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(string(b), "\n")
			t.Logf("last log lines of the replicas and Prometheus:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	rig, err := NewRig(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rig.Close)
	t.Logf("Prometheus %s; rules scaled by %d (shortest duration %v)", rig.Prom.URL, rig.Factor, window)
	queries, nsVar, err := DashboardQueries("../grafana/billing-consumer.json")
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{Rig: rig, Queries: queries, Namespace: rc.Namespace, NamespaceVar: nsVar,
		Timeout: 3 * time.Minute, Logf: t.Logf}
	start := time.Now()
	results, err := r.Run(ctx, Phases(window))
	for _, res := range results {
		t.Logf("%-20s settled after %5.1fs: firing %v; %d dashboard queries returned series", res.Phase.Name,
			res.Settled.Sub(res.Start).Seconds(), res.Firing, res.Queries)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scenario: %v", time.Since(start).Round(time.Second))
	if path := os.Getenv("BILLING_MONITORING_REPORT"); path != "" {
		if err := WriteReport(ctx, path, r, results); err != nil {
			t.Fatal(fmt.Errorf("report: %w", err))
		}
	}
}
