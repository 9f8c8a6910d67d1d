// Package metrics defines every Prometheus metric of billing-consumer
// (SPEC §8) on a registry the caller owns: nothing registers at import
// time, so two instances can live in one test process.
//
// Labels never carry customer, order or event ids: their cardinality would
// grow with the traffic.
package metrics

import "github.com/prometheus/client_golang/prometheus"

// Metrics holds the collectors. Its fields are safe for concurrent use.
type Metrics struct {
	// Events counts finished events by result: charged, duplicate,
	// duplicate_order, dlq.
	Events *prometheus.CounterVec
	// DLQ counts dead-lettered records by reason.
	DLQ *prometheus.CounterVec
	// EventDuration is the time from fetch to offset commit.
	EventDuration prometheus.Histogram
	// PaymentRequests counts provider answers by HTTP status, or "error".
	PaymentRequests *prometheus.CounterVec
	// PaymentDuration is the time of one payment request.
	PaymentDuration prometheus.Histogram
	// ConsumerLag is log-end offset minus the group's committed offset.
	ConsumerLag *prometheus.GaugeVec
	// CommittedOffset is the group's committed offset.
	CommittedOffset *prometheus.GaugeVec
	// DedupPartitions is the number of processed_event partitions.
	DedupPartitions prometheus.Gauge
	// DedupBypassed counts events whose UUIDv7 time fell outside every
	// processed_event partition, decided by the ledger alone.
	DedupBypassed prometheus.Counter
	// Retries counts retried attempts by error kind.
	Retries *prometheus.CounterVec
	// BatchSize is the number of events per billing transaction.
	BatchSize prometheus.Histogram
	// LedgerClaims is the number of charge ledger rows by status, for the
	// two statuses that need attention: pending (claimed, outcome not yet
	// known) and blocked (an operator must decide). Set by the completer.
	LedgerClaims *prometheus.GaugeVec
	// LedgerOldestPending is the age of the oldest pending claim, 0 when
	// there is none. Set by the completer.
	LedgerOldestPending prometheus.Gauge
}

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_events_total", Help: "Events finished, by result (charged, duplicate, duplicate_order, dlq).",
		}, []string{"result"}),
		DLQ: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_dlq_total", Help: "Records sent to the dead-letter topic, by reason.",
		}, []string{"reason"}),
		EventDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "billing_event_duration_seconds", Help: "Time from fetching an event to committing its offset.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}),
		PaymentRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_payment_requests_total", Help: "Payment provider answers, by HTTP status code or error.",
		}, []string{"code"}),
		PaymentDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "billing_payment_duration_seconds", Help: "Duration of one payment request.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "billing_kafka_consumer_lag", Help: "Log-end offset minus the consumer group's committed offset.",
		}, []string{"topic", "partition"}),
		CommittedOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "billing_kafka_committed_offset", Help: "The consumer group's committed offset.",
		}, []string{"topic", "partition"}),
		DedupPartitions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_dedup_partitions", Help: "Number of processed_event partitions.",
		}),
		DedupBypassed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_dedup_out_of_range_total", Help: "Events outside every processed_event partition, decided by the charge ledger alone.",
		}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_retries_total", Help: "Retried processing attempts, by error kind.",
		}, []string{"kind"}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "billing_batch_size", Help: "Events billed per transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		LedgerClaims: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "billing_ledger_claims", Help: "Charge ledger claims that are not settled, by status (pending, blocked).",
		}, []string{"status"}),
		LedgerOldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "billing_ledger_oldest_pending_seconds", Help: "Age of the oldest pending ledger claim; 0 when none is pending.",
		}),
	}
	// Every label value exists from the start, at zero: an alert on
	// rate() or increase() then sees the first DLQ record, instead of a
	// series that is born with it.
	for _, r := range []string{"charged", "duplicate", "duplicate_order", "dlq"} {
		m.Events.WithLabelValues(r)
	}
	for _, r := range []string{"invalid", "permanent", "conflict", "exhausted"} {
		m.DLQ.WithLabelValues(r)
	}
	for _, s := range []string{"pending", "blocked"} {
		m.LedgerClaims.WithLabelValues(s)
	}
	reg.MustRegister(m.Events, m.DLQ, m.EventDuration, m.PaymentRequests, m.PaymentDuration,
		m.ConsumerLag, m.CommittedOffset, m.DedupPartitions, m.DedupBypassed, m.Retries, m.BatchSize,
		m.LedgerClaims, m.LedgerOldestPending)
	return m
}
