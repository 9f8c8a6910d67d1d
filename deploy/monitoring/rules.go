package monitoring

import (
	"errors"
	"fmt"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Rules renders the kustomization in dir (deploy/base, or an overlay) as
// kubectl apply -k would and returns the spec of its one PrometheusRule:
// what the Prometheus operator would load, runbook URLs included.
func Rules(dir string) (monitoringv1.PrometheusRuleSpec, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return monitoringv1.PrometheusRuleSpec{}, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var found []monitoringv1.PrometheusRule
	for _, r := range m.Resources() {
		if r.GetKind() != monitoringv1.PrometheusRuleKind {
			continue
		}
		y, err := r.AsYAML()
		if err != nil {
			return monitoringv1.PrometheusRuleSpec{}, err
		}
		var pr monitoringv1.PrometheusRule
		if err := yaml.UnmarshalStrict(y, &pr); err != nil {
			return monitoringv1.PrometheusRuleSpec{}, fmt.Errorf("%s: PrometheusRule: %w", dir, err)
		}
		found = append(found, pr)
	}
	if len(found) != 1 {
		return monitoringv1.PrometheusRuleSpec{}, fmt.Errorf("%s renders %d PrometheusRules, want 1", dir, len(found))
	}
	return found[0].Spec, nil
}

// Factor is how many times faster than real time the live scenario runs
// the rules: the largest whole factor that leaves the shortest duration of
// spec (a for:, a range or an offset) at least min. With the shortest
// duration 5m and min 10s (ten 1s scrapes, so that every rate() has
// samples to work on) it is 30: 5m becomes 10s, 15m 30s, 1h 2m.
func Factor(spec monitoringv1.PrometheusRuleSpec, min time.Duration) (int, error) {
	var shortest time.Duration
	err := walkDurations(spec, func(d *time.Duration) {
		if *d > 0 && (shortest == 0 || *d < shortest) {
			shortest = *d
		}
	})
	if err != nil {
		return 0, err
	}
	if shortest < min {
		return 0, fmt.Errorf("the shortest duration of the rules, %v, is below %v", shortest, min)
	}
	return int(shortest / min), nil
}

// ruleFile is the on-disk format of Prometheus' rule_files.
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Record      string            `json:"record,omitempty"`
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Scaled is spec as a Prometheus rule file with every duration divided by
// factor: for:, and in each expression every range ([15m]), offset and
// subquery, rewritten through the PromQL parser. Thresholds are values and
// stay as written: an alert on "older than 900 seconds" still means 900
// seconds. A group's own interval is dropped: Prometheus' evaluation
// interval applies.
func Scaled(spec monitoringv1.PrometheusRuleSpec, factor int) ([]byte, error) {
	if factor < 1 {
		return nil, errors.New("scale factor below 1")
	}
	var out ruleFile
	for _, g := range spec.Groups {
		rg := ruleGroup{Name: g.Name}
		for _, r := range g.Rules {
			e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr.String())
			if err != nil {
				return nil, fmt.Errorf("rule %s%s: %w", r.Alert, r.Record, err)
			}
			scaleExpr(e, factor)
			sr := rule{Record: r.Record, Alert: r.Alert, Expr: e.String(), Labels: r.Labels, Annotations: r.Annotations}
			if r.For != nil && *r.For != "" {
				d, err := model.ParseDuration(string(*r.For))
				if err != nil {
					return nil, fmt.Errorf("rule %s: for: %w", r.Alert, err)
				}
				sr.For = model.Duration(time.Duration(d) / time.Duration(factor)).String()
			}
			rg.Rules = append(rg.Rules, sr)
		}
		out.Groups = append(out.Groups, rg)
	}
	return yaml.Marshal(out)
}

// scaleExpr divides every duration of e by factor, in place.
func scaleExpr(e parser.Expr, factor int) {
	forDurations(e, func(d *time.Duration) { *d /= time.Duration(factor) })
}

// forDurations calls f with every range, offset and subquery step of e.
func forDurations(e parser.Expr, f func(*time.Duration)) {
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.MatrixSelector:
			f(&n.Range)
		case *parser.VectorSelector:
			f(&n.OriginalOffset)
		case *parser.SubqueryExpr:
			f(&n.Range)
			f(&n.Step)
			f(&n.OriginalOffset)
		}
		return nil
	})
}

// walkDurations calls f with every duration of spec: for: and those of
// the expressions.
func walkDurations(spec monitoringv1.PrometheusRuleSpec, f func(*time.Duration)) error {
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr.String())
			if err != nil {
				return fmt.Errorf("rule %s%s: %w", r.Alert, r.Record, err)
			}
			forDurations(e, f)
			if r.For != nil && *r.For != "" {
				d, err := model.ParseDuration(string(*r.For))
				if err != nil {
					return fmt.Errorf("rule %s: for: %w", r.Alert, err)
				}
				fd := time.Duration(d)
				f(&fd)
			}
		}
	}
	return nil
}
