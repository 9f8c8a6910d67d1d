package e2e

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// TestMetrics runs the binary on a fixed address, the way the Deployment
// runs it, and checks from the outside what deploy/ relies on: /healthz and
// /readyz answer 200, /metrics exports every billing_* metric that the
// PrometheusRule, the Grafana dashboard and the KEDA ScaledObject name, the
// per-partition gauges mean what the alerts assume once the group has
// drained, and no label carries an order, customer or event id.
func TestMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end metrics test; runs in make test")
	}
	wanted := metricsNamedInDeploy(t)

	const partitions = 2
	w := newWorld(t, partitions, paysim.Faults{})
	first := time.Now().UnixMilli()*10 + 7
	// Every outcome and every labelled series: charges, duplicates, a
	// second event (duplicate_order), a conflict and a decline (DLQ
	// conflict and permanent), invalid records (DLQ invalid), and 500s from
	// the provider (retries, code="500").
	plan := mustPlan(t, harness.Spec{
		Orders: 40, FirstOrderID: first, DuplicateRate: 0.2, Invalid: 2,
		SecondEvents: 1, Conflicts: 1, Declined: 1, Seed: 11, Now: time.Now(),
	})
	w.sim.SetFaults(paysim.Faults{ErrorRate: 0.3, Decline: func(order int64) bool { return plan.Declined[order] }})
	if err := harness.Produce(context.Background(), w.brokers, w.topic, plan.Records); err != nil {
		t.Fatal(err)
	}

	// A fixed address instead of w.env's 127.0.0.1:0: exec.Cmd keeps the
	// last value of a variable given twice (os/exec dedupEnv), and the extra
	// env comes after w.env's defaults.
	addr := kafkatest.FreePort(t)
	p := w.start(t, []string{"BILLING_HTTP_ADDR=" + addr}, "run")
	w.waitDrained(t, p, 2*time.Minute)
	base := "http://" + addr

	if code, body := opsGet(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %q, want 200", code, body)
	}
	pollOps(t, 30*time.Second, "/readyz to answer 200", func() string {
		if code, body := opsGet(t, base+"/readyz"); code != http.StatusOK {
			return fmt.Sprintf("%d %q", code, strings.TrimSpace(body))
		}
		return ""
	})

	// The lag query runs every BILLING_KAFKA_LAG_INTERVAL (1s here): poll
	// until the scrape shows the drained group.
	var families map[string]familyView
	pollOps(t, 30*time.Second, "/metrics to show every metric deploy/ uses, at zero lag", func() string {
		families = scrapeOps(t, base+"/metrics")
		var problems []string
		for _, name := range wanted {
			if _, ok := families[name]; !ok {
				problems = append(problems, "missing "+name)
			}
		}
		lag, committed := families["billing_kafka_consumer_lag"], families["billing_kafka_committed_offset"]
		if got := lag.partitions(w.topic); len(got) != partitions {
			problems = append(problems, fmt.Sprintf("billing_kafka_consumer_lag has partitions %v of %s, want %d", got, w.topic, partitions))
		}
		if s := lag.sumFor(w.topic); s != 0 {
			problems = append(problems, fmt.Sprintf("billing_kafka_consumer_lag sums to %v after draining, want 0", s))
		}
		// Offsets are per partition and start at 0: the committed offsets
		// of a drained topic add up to its record count.
		if s := committed.sumFor(w.topic); s != float64(len(plan.Records)) {
			problems = append(problems, fmt.Sprintf("billing_kafka_committed_offset sums to %v, want %d records", s, len(plan.Records)))
		}
		return strings.Join(problems, "; ")
	})
	if families["billing_events_total"].valueWhere("result", "charged") < 1 {
		t.Error(`billing_events_total{result="charged"} is not positive`)
	}

	checkLabelHygiene(t, families)

	if err := p.Stop(30 * time.Second); err != nil {
		t.Errorf("graceful stop: %v (want exit code 0)", err)
	}
}

// metricsNamedInDeploy extracts the billing_* metric names of the YAML and
// JSON files under deploy/ (the PrometheusRule, the ScaledObject, the
// Grafana dashboard), each reduced to its family name: a histogram's
// _bucket, _sum and _count series belong to one family.
func metricsNamedInDeploy(t *testing.T) []string {
	t.Helper()
	nameRE := regexp.MustCompile(`billing_[a-z_]+`)
	seen := map[string]bool{}
	sources := 0
	err := filepath.WalkDir("../deploy", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ext := filepath.Ext(path); d.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "kind: PrometheusRule") || strings.HasSuffix(path, ".json") {
			sources++
		}
		for _, n := range nameRE.FindAllString(string(b), -1) {
			n = strings.TrimRight(n, "_")
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				n = strings.TrimSuffix(n, suffix)
			}
			seen[n] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	if sources < 2 || len(names) < 8 {
		t.Fatalf("deploy/ has %d rule or dashboard files naming %v: want the PrometheusRule and the dashboard", sources, names)
	}
	t.Logf("metrics named in deploy/: %v", names)
	return names
}

// familyView is one scraped metric family: its series as label sets and
// values.
type familyView struct {
	series []seriesView
}

type seriesView struct {
	labels map[string]string
	value  float64
}

func (f familyView) partitions(topic string) []string {
	var ps []string
	for _, x := range f.series {
		if x.labels["topic"] == topic {
			ps = append(ps, x.labels["partition"])
		}
	}
	slices.Sort(ps)
	return ps
}

// sumFor adds the values of topic's series.
func (f familyView) sumFor(topic string) float64 {
	var s float64
	for _, x := range f.series {
		if x.labels["topic"] == topic {
			s += x.value
		}
	}
	return s
}

func (f familyView) valueWhere(label, value string) float64 {
	for _, x := range f.series {
		if x.labels[label] == value {
			return x.value
		}
	}
	return 0
}

var opsClient = &http.Client{Timeout: 5 * time.Second}

// opsGet returns the status and body of url; a connection error is status 0.
func opsGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := opsClient.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(b)
}

// scrapeOps fetches and parses /metrics (Prometheus text format).
func scrapeOps(t *testing.T, url string) map[string]familyView {
	t.Helper()
	code, body := opsGet(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %q", url, code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]familyView{}
	for name, mf := range mfs {
		var f familyView
		for _, m := range mf.GetMetric() {
			s := seriesView{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.value = m.GetCounter().GetValue()
			case m.Gauge != nil:
				s.value = m.GetGauge().GetValue()
			case m.Histogram != nil:
				s.value = float64(m.GetHistogram().GetSampleCount())
			case m.Untyped != nil:
				s.value = m.GetUntyped().GetValue()
			}
			f.series = append(f.series, s)
		}
		out[name] = f
	}
	return out
}

var (
	labelUUIDRE   = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)
	labelLongIDRE = regexp.MustCompile(`^[0-9]{7,}$`)
	labelIDNameRE = regexp.MustCompile(`(?i)(order|customer|event_?id|charge|idempotency|^id$)`)
)

// checkLabelHygiene fails on what labelHygieneProblems finds.
func checkLabelHygiene(t *testing.T, families map[string]familyView) {
	t.Helper()
	for _, p := range labelHygieneProblems(families) {
		t.Error(p)
	}
}

// labelHygieneProblems finds labels that could carry an order, customer or
// event id (SPEC §8): by name, or by a value shaped like one (a UUID, as
// event ids are, or a long number, as order ids are). It also bounds each
// billing_* family's series, which an id label would make grow with the
// traffic.
func labelHygieneProblems(families map[string]familyView) []string {
	var problems []string
	for name, f := range families {
		if strings.HasPrefix(name, "billing_") && len(f.series) > 50 {
			problems = append(problems, fmt.Sprintf("%s has %d series: a label grows with the traffic", name, len(f.series)))
		}
		for _, s := range f.series {
			for l, v := range s.labels {
				if labelIDNameRE.MatchString(l) {
					problems = append(problems, fmt.Sprintf("%s has label %s: no order, customer or event ids in labels", name, l))
				}
				if labelUUIDRE.MatchString(v) || labelLongIDRE.MatchString(v) {
					problems = append(problems, fmt.Sprintf("%s{%s=%q}: the value looks like an id", name, l, v))
				}
			}
		}
	}
	slices.Sort(problems)
	return problems
}

// TestMetricsLabelHygieneCheck proves labelHygieneProblems tells ids from
// the labels billing-consumer legitimately has.
func TestMetricsLabelHygieneCheck(t *testing.T) {
	series := func(kv ...string) seriesView {
		s := seriesView{labels: map[string]string{}}
		for i := 0; i < len(kv); i += 2 {
			s.labels[kv[i]] = kv[i+1]
		}
		return s
	}
	fine := map[string]familyView{
		"billing_kafka_consumer_lag":       {series: []seriesView{series("topic", "orders-0a1b2c3d4e", "partition", "11")}},
		"billing_payment_requests_total":   {series: []seriesView{series("code", "500"), series("code", "error")}},
		"billing_payment_duration_seconds": {series: []seriesView{series("le", "0.0025")}},
		"go_info":                          {series: []seriesView{series("version", "go1.26.8")}},
	}
	if p := labelHygieneProblems(fine); len(p) > 0 {
		t.Errorf("legitimate labels flagged: %q", p)
	}
	for name, f := range map[string]familyView{
		"order_id label":  {series: []seriesView{series("order_id", "1")}},
		"customer label":  {series: []seriesView{series("customer", "x")}},
		"event id value":  {series: []seriesView{series("key", "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1d")}},
		"order id value":  {series: []seriesView{series("key", "17647324000000")}},
		"too many series": {series: slices.Repeat([]seriesView{series("result", "charged")}, 51)},
	} {
		if p := labelHygieneProblems(map[string]familyView{"billing_x": f}); len(p) == 0 {
			t.Errorf("%s: not flagged", name)
		}
	}
}

// pollOps polls check (an empty answer is success) every 200ms until
// timeout, then fails with the last answer.
func pollOps(t *testing.T, timeout time.Duration, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		last := check()
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %s", what, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
