// Package monitoring proves the alerts and the dashboard of deploy/ on live
// data: it runs two replicas of the built billing-consumer against Kafka,
// Postgres and the payment simulator, a real Prometheus server (built by
// scripts/prometheus.sh) scraping them every second with the labels the
// ServiceMonitor gives (namespace, job, pod) and evaluating the rendered
// PrometheusRule with every duration divided by one factor (see Factor and
// Scaled), and drives them through faults (see Phases).
//
// TestMonitoring asserts, per phase, the alerts Prometheus reports firing
// and the values of every query of the dashboard; with
// BILLING_MONITORING_REPORT set it also writes docs/monitoring.md (make
// monitoring-report). cmd/billing-monitor (make monitor) runs the same rig
// with a fault every minute until interrupted.
package monitoring
