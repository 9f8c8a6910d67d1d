// Package metrics defines every Prometheus metric of billing-consumer
// (SPEC §8) on a registry the caller owns: nothing registers at import
// time, so two instances can live in one test process.
//
// Labels never carry customer, order or event ids: their cardinality would
// grow with the traffic.
package metrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

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
	// ConsumerLag is log-end offset minus the group's committed offset,
	// by topic, group and partition (kafka_exporter's and kminion's
	// consumer-group labels). Every replica reports every partition.
	ConsumerLag *prometheus.GaugeVec
	// CommittedOffset is the group's committed offset, by topic, group and
	// partition.
	CommittedOffset *prometheus.GaugeVec
	// LogEndOffset is the offset the next record of a partition will get,
	// by topic and partition: beside CommittedOffset, it tells a consumer
	// that falls behind from a producer that speeds up.
	LogEndOffset *prometheus.GaugeVec
	// LagLastSuccess is the Unix time of the last lag query the brokers
	// answered; 0 until the first. Lag older than a few intervals is
	// removed (see Lag), so it is never mistaken for real lag.
	LagLastSuccess prometheus.Gauge
	// PartitionsUnowned is the number of partitions of the topic that no
	// member of the group is assigned, by the brokers' view (DescribeGroups;
	// every partition while the group rebalances), by topic and group.
	// PartitionsUnownedLag is the sum of those partitions' lag: records
	// that nobody consumes. Every replica reports the same reading.
	PartitionsUnowned    *prometheus.GaugeVec
	PartitionsUnownedLag *prometheus.GaugeVec
	// EventAge is the time from a record's timestamp (when it was
	// produced) to the commit of its offset.
	EventAge prometheus.Histogram
	// DLQRecords is the number of dead-letter records the replay group has
	// not yet consumed (replayed or skipped).
	DLQRecords prometheus.Gauge
	// DLQOldestAge is the age of the oldest of them, 0 when there is none.
	DLQOldestAge prometheus.Gauge
	// DLQRetention is the dead-letter topic's retention.ms in seconds, 0
	// when unknown or unlimited: an alert compares DLQOldestAge with it.
	DLQRetention prometheus.Gauge
	// BuildInfo is 1, labelled with the version, commit and Go version.
	BuildInfo *prometheus.GaugeVec
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
	// CompleterSettled counts what the completer's passes did to the
	// claims they took up, by result (CompleterResults): the completer's
	// activity.
	CompleterSettled *prometheus.CounterVec
	// ParkedEvents is the number of events whose record was committed
	// while their claim waits for the completer (SPEC §10).
	ParkedEvents prometheus.Gauge
	// DeferredDecided counts the deferred events decided, by result
	// (DeferredResults); their records were counted "parked" when they
	// were deferred.
	DeferredDecided *prometheus.CounterVec
}

// New creates the collectors and registers them on reg. version and commit
// label billing_build_info.
func New(reg prometheus.Registerer, version, commit string) *Metrics {
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: EventsTotal, Help: "Events finished, by result (charged, duplicate, duplicate_order, dlq, parked).",
		}, []string{"result"}),
		DLQ: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: DLQTotal, Help: "Records sent to the dead-letter topic, by reason.",
		}, []string{"reason"}),
		EventDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: EventDurationSeconds, Help: "Time from fetching an event to committing its offset.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}),
		PaymentRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: PaymentRequestsTotal, Help: "Payment provider answers, by HTTP status code or error.",
		}, []string{"code"}),
		PaymentDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: PaymentDurationSeconds, Help: "Duration of one payment request.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: KafkaConsumerLag, Help: "Log-end offset minus the consumer group's committed offset.",
		}, []string{"topic", "group", "partition"}),
		CommittedOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: KafkaCommittedOffset, Help: "The consumer group's committed offset.",
		}, []string{"topic", "group", "partition"}),
		LogEndOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: KafkaLogEndOffset, Help: "The offset the next record of the partition will get.",
		}, []string{"topic", "partition"}),
		LagLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: KafkaLagLastSuccess, Help: "Unix time of the last consumer-lag query the brokers answered; 0 before the first.",
		}),
		PartitionsUnowned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: KafkaPartitionsUnowned, Help: "Partitions of the topic that no member of the group is assigned, by the brokers' view (all of them while the group rebalances).",
		}, []string{"topic", "group"}),
		PartitionsUnownedLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: KafkaPartitionsUnownedLag, Help: "Sum of the lag of the partitions that no member of the group is assigned: records nobody consumes.",
		}, []string{"topic", "group"}),
		EventAge: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: EventAgeSeconds, Help: "Time from a record's timestamp to the commit of its offset.",
			Buckets: []float64{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 6 * 3600, 24 * 3600},
		}),
		DLQRecords: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: DLQRecordsPending, Help: "Dead-letter records not yet consumed by dlq replay.",
		}),
		DLQOldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: DLQOldestRecordAge, Help: "Age of the oldest dead-letter record not yet consumed by dlq replay; 0 when none.",
		}),
		DLQRetention: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: DLQRetentionSeconds, Help: "retention.ms of the dead-letter topic in seconds; 0 when unknown or unlimited.",
		}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: BuildInfoName, Help: "Always 1; the labels say which build runs.",
		}, []string{"version", "commit", "goversion"}),
		DedupPartitions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: DedupPartitionCount, Help: "Number of processed_event partitions.",
		}),
		DedupBypassed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: DedupOutOfRangeTotal, Help: "Events outside every processed_event partition, decided by the charge ledger alone.",
		}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: RetriesTotal, Help: "Retried processing attempts, by error kind.",
		}, []string{"kind"}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: BatchSizeEvents, Help: "Events billed per transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		LedgerClaims: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: LedgerClaimCount, Help: "Charge ledger claims that are not settled, by status (pending, blocked).",
		}, []string{"status"}),
		CompleterSettled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: CompleterSettled, Help: "Claims the completer took up, by result: charged, blocked, pending (re-sent, still unknown), moved (released or settled meanwhile, nothing sent).",
		}, []string{"result"}),
		ParkedEvents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: ParkedEventsCount, Help: "Events whose record was committed while their claim, or their decision, waits for the completer.",
		}),
		DeferredDecided: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: DeferredDecided, Help: "Deferred events decided once the claim they waited on settled, by result: charged, duplicate, duplicate_order, dlq.",
		}, []string{"result"}),
		LedgerOldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: LedgerOldestPendingAge, Help: "Age of the oldest pending ledger claim; 0 when none is pending.",
		}),
	}
	// Every label value exists from the start, at zero: an alert on
	// rate() or increase() then sees the first DLQ record, instead of a
	// series that is born with it.
	for _, r := range []string{"charged", "duplicate", "duplicate_order", "dlq", "parked"} {
		m.Events.WithLabelValues(r)
	}
	for _, r := range []string{"invalid", "permanent", "conflict", "exhausted"} {
		m.DLQ.WithLabelValues(r)
	}
	for _, k := range RetryKinds {
		m.Retries.WithLabelValues(k)
	}
	for _, s := range []string{"pending", "blocked"} {
		m.LedgerClaims.WithLabelValues(s)
	}
	for _, r := range CompleterResults {
		m.CompleterSettled.WithLabelValues(r)
	}
	for _, r := range DeferredResults {
		m.DeferredDecided.WithLabelValues(r)
	}
	// Payment answers the rules and the dashboard count: a restarted
	// instance with only duplicates to process still exports them.
	for _, c := range PaymentCodes {
		m.PaymentRequests.WithLabelValues(c)
	}
	m.BuildInfo.WithLabelValues(version, commit, runtime.Version()).Set(1)
	reg.MustRegister(m.Events, m.DLQ, m.EventDuration, m.PaymentRequests, m.PaymentDuration,
		m.ConsumerLag, m.CommittedOffset, m.LogEndOffset, m.LagLastSuccess, m.EventAge,
		m.PartitionsUnowned, m.PartitionsUnownedLag,
		m.DedupPartitions, m.DedupBypassed, m.Retries, m.BatchSize,
		m.LedgerClaims, m.LedgerOldestPending, m.CompleterSettled, m.ParkedEvents, m.DeferredDecided, m.DLQRecords, m.DLQOldestAge, m.DLQRetention, m.BuildInfo)
	return m
}
