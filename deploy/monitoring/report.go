package monitoring

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// span is one stretch of time an alert instance fired.
type span struct {
	alert    string
	from, to time.Time
}

// chart is one picture of the report: a dashboard panel's query over the
// whole run.
type chart struct{ file, panel, title, unit string }

var charts = []chart{
	{"lag.svg", "Consumer lag per partition", "Consumer lag per partition (max across replicas)", "records"},
	{"events.svg", "Events by result", "Events/s by result", "events/s"},
	{"payments.svg", "Payment requests by code", "Payment answers/s by code", "requests/s"},
}

// WriteReport writes the report of a finished run to path (a Markdown
// file) and its charts beside it, in a directory named after it without
// .md: range queries of the run's Prometheus for three dashboard panels,
// the alerts' firing spans (the ALERTS series), and the phases.
func WriteReport(ctx context.Context, path string, r *Runner, results []PhaseResult) error {
	t0, t1 := r.begin, time.Now()
	dir := strings.TrimSuffix(path, ".md")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var bands []band
	for _, res := range results {
		bands = append(bands, band{res.Phase.Name, res.Start, res.End})
	}
	vars := Variables{Namespace: r.Namespace, RateInterval: 4 * r.Rig.cfg.Interval, Range: t1.Sub(t0)}
	for _, c := range charts {
		q, ok := r.query(c.panel)
		if !ok {
			return fmt.Errorf("the dashboard has no panel %q", c.panel)
		}
		m, err := r.rangeQuery(ctx, vars.Substitute(q.Expr), t0, t1)
		if err != nil {
			return err
		}
		var lines []line
		for _, s := range m {
			if nonZero(s.Values) {
				lines = append(lines, line{legend(q.Legend, s.Metric), points(s.Values)})
			}
		}
		sort.Slice(lines, func(i, j int) bool { return lines[i].name < lines[j].name })
		svg := lineChart(c.title, c.unit, lines, bands, t0, t1)
		if err := os.WriteFile(filepath.Join(dir, c.file), []byte(svg), 0o644); err != nil {
			return err
		}
	}
	spans, err := r.alertSpans(ctx, t0, t1)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.svg"), []byte(spansChart("Alerts firing", spans, bands, t0, t1)), 0o644); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(r.markdown(filepath.Base(dir), results, spans, t0, t1)), 0o644)
}

func (r *Runner) query(panel string) (PanelQuery, bool) {
	for _, q := range r.Queries {
		if q.Panel == panel {
			return q, true
		}
	}
	return PanelQuery{}, false
}

func (r *Runner) rangeQuery(ctx context.Context, expr string, t0, t1 time.Time) (model.Matrix, error) {
	v, _, _, err := r.Rig.Prom.API.QueryRange(ctx, expr, promv1.Range{Start: t0, End: t1, Step: r.Rig.cfg.Interval})
	if err != nil {
		return nil, fmt.Errorf("range query %s: %w", expr, err)
	}
	m, ok := v.(model.Matrix)
	if !ok {
		return nil, fmt.Errorf("range query %s: result of type %s", expr, v.Type())
	}
	return m, nil
}

// alertSpans reads the ALERTS series Prometheus writes at every evaluation
// of a firing alert: a gap of more than two steps ends a span.
func (r *Runner) alertSpans(ctx context.Context, t0, t1 time.Time) ([]span, error) {
	m, err := r.rangeQuery(ctx, `ALERTS{alertstate="firing"}`, t0, t1)
	if err != nil {
		return nil, err
	}
	step := r.Rig.cfg.Interval
	var spans []span
	for _, s := range m {
		name := Alert{Name: string(s.Metric[model.AlertNameLabel]), Labels: instanceLabels(s.Metric)}.String()
		var cur *span
		for _, p := range s.Values {
			t := p.Timestamp.Time()
			if cur != nil && t.Sub(cur.to) <= 2*step {
				cur.to = t
				continue
			}
			spans = append(spans, span{name, t, t})
			cur = &spans[len(spans)-1]
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
	return spans, nil
}

func instanceLabels(m model.Metric) string {
	var ls []string
	for _, l := range distinguishing {
		if v, ok := m[model.LabelName(l)]; ok {
			ls = append(ls, l+"="+string(v))
		}
	}
	return strings.Join(ls, ",")
}

var legendVar = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// legend renders a Grafana legend format for a series.
func legend(format string, m model.Metric) string {
	return legendVar.ReplaceAllStringFunc(format, func(s string) string {
		return string(m[model.LabelName(legendVar.FindStringSubmatch(s)[1])])
	})
}

func nonZero(ps []model.SamplePair) bool {
	for _, p := range ps {
		if p.Value != 0 && p.Value == p.Value {
			return true
		}
	}
	return false
}

func points(ps []model.SamplePair) []point {
	out := make([]point, len(ps))
	for i, p := range ps {
		out[i] = point{p.Timestamp.Time(), float64(p.Value)}
	}
	return out
}

// phaseAt names the phase running at t.
func phaseAt(results []PhaseResult, t time.Time) string {
	for _, res := range results {
		if !t.Before(res.Start) && t.Before(res.End) {
			return res.Phase.Name
		}
	}
	return "(after the run)"
}
