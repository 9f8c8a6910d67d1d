package monitoring

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// PanelQuery is one query of the Grafana dashboard.
type PanelQuery struct {
	Panel, RefID, Legend, Expr string
}

func (q PanelQuery) String() string { return q.Panel + "/" + q.RefID }

// DashboardQueries reads every panel query of the dashboard JSON at path,
// and the query of its namespace variable.
func DashboardQueries(path string) (queries []PanelQuery, namespaceVar string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID  string `json:"refId"`
				Expr   string `json:"expr"`
				Legend string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			queries = append(queries, PanelQuery{Panel: p.Title, RefID: t.RefID, Legend: t.Legend, Expr: t.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Name != "namespace" {
			continue
		}
		// Grafana takes a variable's query as a string or as {"query": ...}.
		switch q := v.Query.(type) {
		case string:
			namespaceVar = q
		case map[string]any:
			namespaceVar, _ = q["query"].(string)
		}
	}
	if len(queries) == 0 || namespaceVar == "" {
		return nil, "", fmt.Errorf("%s: %d queries, namespace variable %q", path, len(queries), namespaceVar)
	}
	return queries, namespaceVar, nil
}

// Variables are the values Grafana would give the dashboard's variables.
type Variables struct {
	Namespace string
	// RateInterval is $__rate_interval: Grafana makes it four scrape
	// intervals at least.
	RateInterval time.Duration
	// Range is $__range, the time range shown.
	Range time.Duration
}

var grafanaVar = regexp.MustCompile(`\$(namespace|__rate_interval|__interval|__range)\b`)

// Substitute replaces the dashboard variables of expr as Grafana would.
func (v Variables) Substitute(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(s string) string {
		switch s {
		case "$namespace":
			// A Kubernetes namespace is a DNS label: nothing in it
			// needs escaping in a regular expression.
			return v.Namespace
		case "$__range":
			return model.Duration(v.Range.Truncate(time.Second)).String()
		default:
			return model.Duration(v.RateInterval).String()
		}
	})
}

// Check is what a phase expects of one panel's series.
type Check struct {
	Want string // what the check expects, for messages
	OK   func(model.Vector) bool
}

// someAbove: at least one series above x.
func someAbove(x float64) Check {
	return Check{fmt.Sprintf("some series > %g", x), func(v model.Vector) bool {
		for _, s := range v {
			if float64(s.Value) > x {
				return true
			}
		}
		return false
	}}
}

// allEqual: every series equals x.
func allEqual(x float64) Check {
	return Check{fmt.Sprintf("every series = %g", x), func(v model.Vector) bool {
		for _, s := range v {
			if float64(s.Value) != x {
				return false
			}
		}
		return len(v) > 0
	}}
}

// someEqual: at least one series equals x.
func someEqual(x float64) Check {
	return Check{fmt.Sprintf("some series = %g", x), func(v model.Vector) bool {
		for _, s := range v {
			if float64(s.Value) == x {
				return true
			}
		}
		return false
	}}
}

// notAbove: no series above x (NaN, a ratio without traffic, is not).
func notAbove(x float64) Check {
	return Check{fmt.Sprintf("no series > %g", x), func(v model.Vector) bool {
		for _, s := range v {
			if f := float64(s.Value); !math.IsNaN(f) && f > x {
				return false
			}
		}
		return true
	}}
}

// series: the series whose label l is value passes c.
func series(l, value string, c Check) Check {
	return Check{fmt.Sprintf("%s=%q: %s", l, value, c.Want), func(v model.Vector) bool {
		var sel model.Vector
		for _, s := range v {
			if string(s.Metric[model.LabelName(l)]) == value {
				sel = append(sel, s)
			}
		}
		return len(sel) > 0 && c.OK(sel)
	}}
}

// show renders a vector shortly: {labels} value, ...
func show(v model.Vector) string {
	var parts []string
	for _, s := range v {
		parts = append(parts, fmt.Sprintf("%s %.4g", s.Metric, float64(s.Value)))
	}
	if len(parts) > 6 {
		parts = append(parts[:6], fmt.Sprintf("... (%d series)", len(v)))
	}
	return strings.Join(parts, ", ")
}
