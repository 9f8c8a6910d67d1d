package grafana

import (
	"fmt"
	"strings"
)

// Job is the job label Prometheus gives billing-consumer's series: the
// Service's name, which the ServiceMonitor (deploy/base) scrapes.
const Job = "billing-consumer"

// sel selects metric for the dashboard's namespaces and billing-consumer's
// job; extra are further matchers such as `code=~"5.."`. Every selector of
// the dashboard is made here, so none can forget the two filters.
func sel(metric string, extra ...string) string {
	m := append([]string{`namespace=~"$namespace"`, fmt.Sprintf("job=%q", Job)}, extra...)
	return metric + "{" + strings.Join(m, ", ") + "}"
}

// rate is the per-second rate of a counter over Grafana's $__rate_interval.
func rate(metric string, extra ...string) string {
	return "rate(" + sel(metric, extra...) + "[$__rate_interval])"
}

// increase is the increase of a counter over window (a Grafana variable
// such as $__range).
func increase(metric, window string) string {
	return "increase(" + sel(metric) + "[" + window + "])"
}

// quantile is the q-quantile of a histogram across replicas.
func quantile(q, histogram string) string {
	return "histogram_quantile(" + q + ", sum by (le) (" + rate(histogram+"_bucket") + "))"
}

// perPartition is a per-partition gauge taken across replicas: every
// replica reports every partition, so max, never sum (see the recording
// rules in deploy/base/prometheusrule.yaml).
func perPartition(metric string) string {
	return "max by (topic, partition) (" + sel(metric) + ")"
}
