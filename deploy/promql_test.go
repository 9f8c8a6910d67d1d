package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/billing-consumer/billing-consumer/internal/metrics"
)

const (
	rulesFile     = "base/prometheusrule.yaml"
	dashboardFile = "grafana/billing-consumer.json"
	runbookDoc    = "../docs/operations.md"
	runbookPrefix = "https://github.com/billing-consumer/billing-consumer/blob/main/docs/operations.md#"
)

// externalMetrics are series the rules and the dashboard may read that
// billing-consumer does not export: Prometheus' own up, and
// kube-state-metrics' Deployment status.
var externalMetrics = map[string]bool{
	"up": true, "kube_deployment_status_replicas_unavailable": true, "kube_deployment_spec_replicas": true,
}

// perPartitionMetrics are reported by every replica for every partition:
// summed over pods they would count each partition once per replica.
var perPartitionMetrics = map[string]bool{
	"billing_kafka_consumer_lag": true, "billing_kafka_committed_offset": true, "billing_kafka_log_end_offset": true,
}

func promQL() parser.Parser { return parser.NewParser(parser.Options{}) }

// declaredMetrics is the billing_* metric names internal/metrics registers:
// metrics.New registers on a Registerer that records the name of every
// collector's descriptions (a vector without children yet included).
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	metrics.New(recordNames(names), "test", "test")
	metrics.NewControl(recordNames(names), "test")
	metrics.NewPositionWritesFailed(recordNames(names))
	metrics.NewHeal(recordNames(names))
	if len(names) < 8 {
		t.Fatalf("internal/metrics registers %d billing_* metrics", len(names))
	}
	return names
}

// recordNames is a prometheus.Registerer that records the fully qualified
// names of what is registered on it. prometheus.Desc has no accessor for
// its name: its String form is parsed.
type recordNames map[string]bool

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r recordNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil && strings.HasPrefix(m[1], "billing_") {
			r[m[1]] = true
		}
	}
	return nil
}

func (r recordNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r recordNames) Unregister(prometheus.Collector) bool { return false }

// baseName strips the suffixes of a histogram's or summary's series.
func baseName(name string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if n, ok := strings.CutSuffix(name, s); ok {
			return n
		}
	}
	return name
}

// checkExpr parses a PromQL expression and returns the metric names it
// reads, reporting the problems exprProblems finds.
func checkExpr(t *testing.T, where, expr string) []string {
	t.Helper()
	names, problems := exprProblems(expr)
	for _, p := range problems {
		t.Errorf("%s: %s\n%s", where, p, expr)
	}
	return names
}

// exprProblems parses expr and returns the metric names it reads. A
// per-partition metric not first reduced with max by (..., partition) is a
// problem.
func exprProblems(expr string) (names, problems []string) {
	e, err := promQL().ParseExpr(expr)
	if err != nil {
		return nil, []string{err.Error()}
	}
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		names = append(names, vs.Name)
		if !perPartitionMetrics[vs.Name] {
			return nil
		}
		for i := len(path) - 1; i >= 0; i-- {
			if a, ok := path[i].(*parser.AggregateExpr); ok {
				if a.Op != parser.MAX || a.Without || !slices.Contains(a.Grouping, "partition") {
					problems = append(problems, fmt.Sprintf("%s is first aggregated with %s; every replica reports every partition: use max by (..., partition)", vs.Name, a.Op))
				}
				return nil
			}
		}
		return nil
	})
	return names, problems
}

func checkNames(t *testing.T, where string, names []string, declared, recorded map[string]bool) {
	t.Helper()
	for _, n := range names {
		if !declared[baseName(n)] && !externalMetrics[n] && !recorded[n] {
			t.Errorf("%s: metric %s is neither exported by billing-consumer (%s) nor known", where, n, "internal/metrics")
		}
	}
}

// loadRules returns the PrometheusRule as kustomize renders the base: its
// runbook URLs are completed there from their one place (see
// TestRunbookURLInOnePlace).
func loadRules(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	return one[monitoringv1.PrometheusRule](t, render(t, "base"))
}

// TestRunbookURLInOnePlace: the runbooks' address is written once, in the
// PrometheusRule's annotation; every alert names only its anchor.
func TestRunbookURLInOnePlace(t *testing.T) {
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSuffix(runbookPrefix, "#")
	if n := strings.Count(string(b), base); n != 1 {
		t.Errorf("%s names %s %d times, want once (the billing-consumer/runbook-base-url annotation)", rulesFile, base, n)
	}
	if !regexp.MustCompile(`(?m)^\s+runbook_url: "#[a-z]+"$`).Match(b) {
		t.Errorf("%s: runbook_url values are not bare anchors", rulesFile)
	}
}

// docAnchors returns the anchors GitHub generates for the headings of
// docs/operations.md.
func docAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(runbookDoc)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		anchors[strings.ReplaceAll(drop.ReplaceAllString(h, ""), " ", "-")] = true
	}
	return anchors
}

// templateFuncs are the names of Prometheus' alert template functions
// (github.com/prometheus/prometheus/template), stubbed: only the syntax and
// the names are checked here.
var templateFuncs = func() template.FuncMap {
	fm := template.FuncMap{}
	for _, n := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage",
		"humanizeTimestamp", "toTime", "toDuration", "title", "toUpper", "toLower", "match", "reReplaceAll",
		"graphLink", "tableLink", "sortByLabel", "strvalue", "args", "safeHtml", "externalURL", "pathPrefix",
		"query", "first", "label", "value", "stripPort", "stripDomain", "parseDuration", "now"} {
		fm[n] = func(...any) any { return nil }
	}
	return fm
}()

var labelRefRE = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// TestAlertRules parses every expression of the PrometheusRule and checks
// each alert's labels, annotations and runbook.
func TestAlertRules(t *testing.T) {
	pr := loadRules(t)
	declared := declaredMetrics(t)
	anchors := docAnchors(t)
	recorded := map[string]bool{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	// The labels each recording rule keeps, for the annotations of the
	// alerts built on it.
	recordKept := map[string]map[string]bool{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recordKept[r.Record] = keptLabels(r.Expr.String(), nil)
			}
		}
	}
	alerts := map[string]monitoringv1.Rule{}
	for _, g := range pr.Spec.Groups {
		if len(g.Rules) == 0 {
			t.Errorf("group %s has no rules", g.Name)
		}
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("%s: a rule is an alert or a recording rule", where)
				continue
			}
			expr := r.Expr.String()
			names := checkExpr(t, where, expr)
			checkNames(t, where, names, declared, recorded)
			if r.For != nil {
				if _, err := model.ParseDuration(string(*r.For)); err != nil {
					t.Errorf("%s: for %q: %v", where, *r.For, err)
				}
			}
			if r.Record != "" {
				if strings.Count(r.Record, ":") != 2 {
					t.Errorf("%s: recording rule name is not level:metric:operations", where)
				}
				continue
			}
			if _, dup := alerts[r.Alert]; dup {
				t.Errorf("%s: alert defined twice", where)
			}
			alerts[r.Alert] = r
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", where, s)
			}
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[k] == "" {
					t.Errorf("%s: no %s annotation", where, k)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookPrefix)
			if !ok || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q is not a heading of %s", where, r.Annotations["runbook_url"], runbookDoc)
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook anchor %q, want the alert name in lower case", where, anchor)
			}
			checkTemplates(t, where, keptLabels(expr, recordKept), r.Annotations)
		}
	}

	// What the issue asks the alerts to cover.
	for name, want := range map[string]struct {
		severity string
		has      []string
	}{
		"BillingConsumerLagGrowing":        {"warning", []string{"deriv(", "> 1000"}},
		"BillingConsumerStalled":           {"critical", []string{"billing_kafka_committed_offset:max offset 10m", "billing_kafka_consumer_lag", "> 0"}},
		"BillingConsumerDeadLettering":     {"warning", []string{"increase(billing_dlq_total", `reason!="conflict"`}},
		"BillingConsumerLagStale":          {"warning", []string{"billing_kafka_lag_last_success_timestamp_seconds"}},
		"BillingEventAgeHigh":              {"warning", []string{"billing_event_age_seconds_bucket"}},
		"BillingDLQRetentionNear":          {"warning", []string{"billing_dlq_oldest_record_age_seconds", "billing_dlq_retention_seconds"}},
		"BillingLedgerClaimBlocked":        {"critical", []string{`billing_ledger_claims{job="billing-consumer", status="blocked"}`}},
		"BillingLedgerClaimPendingTooLong": {"warning", []string{"billing_ledger_oldest_pending_seconds", "> 900"}},
		"BillingConsumerOffsetsBackwards":  {"warning", []string{"offset 5m"}},
		"BillingConsumerChargeConflict":    {"critical", []string{"billing_dlq_total", `reason="conflict"`}},
		"BillingPaymentErrorRate":          {"warning", []string{"billing_payment_requests_total", `code=~"5..|429|error"`}},
		"BillingPaymentLatencyHigh":        {"warning", []string{"histogram_quantile(0.99", "billing_payment_duration_seconds_bucket"}},
		"BillingConsumerNotReady":          {"warning", []string{"kube_deployment_status_replicas_unavailable"}},
		"BillingConsumerDown":              {"critical", []string{`up{job="billing-consumer"}`}},
		"BillingConsumerPausedTooLong":     {"warning", []string{"billing_paused_seconds", "> 3600"}},
	} {
		r, ok := alerts[name]
		if !ok {
			t.Errorf("alert %s is missing", name)
			continue
		}
		if r.Labels["severity"] != want.severity {
			t.Errorf("%s: severity %s, want %s", name, r.Labels["severity"], want.severity)
		}
		for _, s := range want.has {
			if !strings.Contains(r.Expr.String(), s) {
				t.Errorf("%s: expression does not contain %q", name, s)
			}
		}
	}
}

// keptLabels approximates the labels an expression's result keeps: the
// grouping labels of its aggregations, and those of the recording rules it
// reads.
func keptLabels(expr string, recordKept map[string]map[string]bool) map[string]bool {
	kept := map[string]bool{}
	e, err := promQL().ParseExpr(expr)
	if err != nil {
		return kept // reported by checkExpr
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.AggregateExpr:
			if !n.Without {
				for _, g := range n.Grouping {
					kept[g] = true
				}
			}
		case *parser.VectorSelector:
			for l := range recordKept[n.Name] {
				kept[l] = true
			}
		}
		return nil
	})
	return kept
}

// checkTemplates parses the annotations as Prometheus does (with $labels
// and $value defined) and checks that every $labels.X is a label the
// expression keeps.
func checkTemplates(t *testing.T, where string, kept map[string]bool, annotations map[string]string) {
	t.Helper()
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
	for k, v := range annotations {
		if _, err := template.New(k).Funcs(templateFuncs).Option("missingkey=zero").Parse(defs + v); err != nil {
			t.Errorf("%s: annotation %s: %v", where, k, err)
		}
		for _, m := range labelRefRE.FindAllStringSubmatch(v, -1) {
			if !kept[m[1]] {
				t.Errorf("%s: annotation %s uses $labels.%s, which the expression does not keep", where, k, m[1])
			}
		}
	}
}

// dashboard is the part of Grafana's dashboard model the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

var grafanaRangeVar = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)

// grafanaExpr replaces Grafana's interval variables, which PromQL does not
// know, with a duration. Dashboard variables such as $namespace only appear
// inside label values, where they are valid strings.
func grafanaExpr(s string) string { return grafanaRangeVar.ReplaceAllString(s, "5m") }

// TestDashboard parses every query of the Grafana dashboard and checks that
// it shows every metric billing-consumer exports.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard without uid or title")
	}
	declared := declaredMetrics(t)
	shown := map[string]bool{}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			where := "panel " + p.Title
			if ids[p.ID] {
				t.Errorf("%s: id %d used twice", where, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
				t.Errorf("%s: gridPos %+v outside the 24-column grid", where, p.GridPos)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: datasource must be the ${datasource} variable", where)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no query", where)
			}
			for _, tg := range p.Targets {
				for _, pr := range unfilteredSelectors(grafanaExpr(tg.Expr)) {
					t.Errorf("%s/%s: %s", where, tg.RefID, pr)
				}
				names := checkExpr(t, where+"/"+tg.RefID, grafanaExpr(tg.Expr))
				checkNames(t, where, names, declared, nil)
				for _, n := range names {
					shown[baseName(n)] = true
				}
			}
		}
	}
	walk(d.Panels)
	for n := range declared {
		if !shown[n] {
			t.Errorf("metric %s is exported but on no panel", n)
		}
	}
	for _, q := range []string{"0.5", "0.95", "0.99"} {
		if !strings.Contains(string(b), "histogram_quantile("+q+", sum by (le) (rate(billing_payment_duration_seconds_bucket") {
			t.Errorf("no p%s panel of billing_payment_duration_seconds", strings.TrimPrefix(q, "0."))
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// Grafana takes the query as a string or as {"query": ...}.
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q.Query); err != nil {
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: %v", v.Name, err)
				continue
			}
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q.Query)
			continue
		}
		checkNames(t, "variable "+v.Name, checkExpr(t, "variable "+v.Name, m[1]), declared, nil)
	}
}

// TestPerPartitionCheck proves checkExpr catches lag summed over replicas.
func TestPerPartitionCheck(t *testing.T) {
	for expr, wantProblem := range map[string]bool{
		`sum(billing_kafka_consumer_lag)`:                                        true,
		`sum by (partition) (billing_kafka_committed_offset)`:                    true,
		`max(billing_kafka_consumer_lag)`:                                        true,
		`sum(max by (topic, partition) (billing_kafka_consumer_lag))`:            false,
		`max by (partition) (changes(billing_kafka_committed_offset[10m])) == 0`: false,
	} {
		if _, problems := exprProblems(expr); (len(problems) > 0) != wantProblem {
			t.Errorf("%s: problems %q, want a problem: %v", expr, problems, wantProblem)
		}
	}
}

// unfilteredSelectors returns a problem for every selector of expr that
// does not select both the dashboard's namespaces (namespace=~"$namespace")
// and billing-consumer's job: without them a panel mixes namespaces, or
// another job's series of the same name.
func unfilteredSelectors(expr string) []string {
	e, err := promQL().ParseExpr(expr)
	if err != nil {
		return nil // reported by checkExpr
	}
	var problems []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		ns, job := false, false
		for _, m := range vs.LabelMatchers {
			ns = ns || (m.Name == "namespace" && m.Type == labels.MatchRegexp && m.Value == "$namespace")
			job = job || (m.Name == "job" && m.Type == labels.MatchEqual && m.Value == "billing-consumer")
		}
		if !ns || !job {
			problems = append(problems, fmt.Sprintf(`%s is not filtered by namespace=~"$namespace" and job="billing-consumer"`, vs.Name))
		}
		return nil
	})
	return problems
}
