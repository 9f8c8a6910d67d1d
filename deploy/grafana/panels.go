package grafana

import (
	m "github.com/billing-consumer/billing-consumer/internal/metrics"
)

// eventsMetric is the series the namespace variable lists namespaces from:
// every replica exports it from its first scrape.
const eventsMetric = m.EventsTotal

// rows is the dashboard, top to bottom.
var rows = []row{
	{"Overview", []func() panel{totalLag, eventsPerSecond, deadLetteredInRange, replicasUp}},
	{"Kafka", []func() panel{lagPerPartition, committedPerPartition, commitRatePerPartition, eventDuration, unownedPartitions, positionWritesFailed, failoverHeal}},
	{"Outcomes", []func() panel{eventsByResult, deadLetteredByReason, retriesByKind}},
	{"Payment provider", []func() panel{paymentLatency, paymentByCode, paymentErrorRatio}},
	{"Replicas", []func() panel{upPerReplica, partitionsOwned, operatorPause, buildsRunning}},
	{"Retention", []func() panel{dedupPartitions, dedupOutOfRange, batchSize}},
	{"Lag health, dead letters", []func() panel{logEndVsCommitted, lagQueryAge, eventAge, dlqRecords, dlqOldestVsRetention}},
	{"Completer (pending and blocked claims)", []func() panel{ledgerClaims, oldestPendingClaim, parkedEvents, completerActivity}},
}

func totalLag() panel {
	return panel{title: "Total consumer lag", unit: "short", stat: true,
		queries: []query{{"lag", "sum(" + perPartition(m.KafkaConsumerLag) + ")"}}}
}

func eventsPerSecond() panel {
	return panel{title: "Events / s", unit: "ops", stat: true,
		queries: []query{{"events/s", "sum(" + rate(m.EventsTotal) + ")"}}}
}

func deadLetteredInRange() panel {
	return panel{title: "Dead-lettered (range)", unit: "short", stat: true,
		queries: []query{{"dlq", "sum(" + increase(m.DLQTotal, "$__range") + ")"}}}
}

func replicasUp() panel {
	return panel{title: "Replicas up", unit: "short", stat: true,
		queries: []query{{"up", "count(" + sel("up") + " == 1)"}}}
}

func lagPerPartition() panel {
	return panel{title: "Consumer lag per partition", unit: "short",
		queries: []query{{"{{topic}}/{{partition}}", perPartition(m.KafkaConsumerLag)}}}
}

func committedPerPartition() panel {
	return panel{title: "Committed offset per partition", unit: "short",
		queries: []query{{"{{topic}}/{{partition}}", perPartition(m.KafkaCommittedOffset)}}}
}

func commitRatePerPartition() panel {
	return panel{title: "Commit rate per partition", unit: "ops",
		queries: []query{{"{{topic}}/{{partition}}",
			"max by (topic, partition) (deriv(" + sel(m.KafkaCommittedOffset) + "[$__rate_interval]))"}}}
}

func eventDuration() panel {
	return panel{title: "Event duration (fetch to commit)", unit: "s", queries: []query{
		{"p50", quantile("0.5", m.EventDurationSeconds)},
		{"p95", quantile("0.95", m.EventDurationSeconds)},
		{"p99", quantile("0.99", m.EventDurationSeconds)},
	}}
}

func eventsByResult() panel {
	return panel{title: "Events by result", unit: "ops",
		queries: []query{{"{{result}}", "sum by (result) (" + rate(m.EventsTotal) + ")"}}}
}

func deadLetteredByReason() panel {
	return panel{title: "Dead-lettered by reason", unit: "short",
		queries: []query{{"{{reason}}", "sum by (reason) (" + increase(m.DLQTotal, "$__rate_interval") + ")"}}}
}

func retriesByKind() panel {
	return panel{title: "Retries by kind", unit: "ops",
		queries: []query{{"{{kind}}", "sum by (kind) (" + rate(m.RetriesTotal) + ")"}}}
}

func paymentLatency() panel {
	return panel{title: "Payment latency", unit: "s", queries: []query{
		{"p50", quantile("0.5", m.PaymentDurationSeconds)},
		{"p95", quantile("0.95", m.PaymentDurationSeconds)},
		{"p99", quantile("0.99", m.PaymentDurationSeconds)},
	}}
}

func paymentByCode() panel {
	return panel{title: "Payment requests by code", unit: "reqps",
		queries: []query{{"{{code}}", "sum by (code) (" + rate(m.PaymentRequestsTotal) + ")"}}}
}

// paymentErrorRatio counts as errors what BillingPaymentErrorRate does:
// 5xx, 429 and no answer at all.
func paymentErrorRatio() panel {
	return panel{title: "Payment error ratio", unit: "percentunit", queries: []query{{"errors",
		"sum(" + rate(m.PaymentRequestsTotal, `code=~"5..|429|error"`) + ") / sum(" + rate(m.PaymentRequestsTotal) + ")"}}}
}

// upPerReplica is Prometheus' scrape of each pod: 0 for a replica that is
// down (killed, stopped) while its target remains.
func upPerReplica() panel {
	return panel{title: "Scrape up per replica", unit: "short",
		queries: []query{{"{{pod}}", "max by (pod) (" + sel("up") + ")"}}}
}

func buildsRunning() panel {
	return panel{title: "Builds running", unit: "short", queries: []query{{"{{version}} ({{commit}}, {{goversion}})",
		"count by (version, commit, goversion) (" + sel(m.BuildInfoName) + ")"}}}
}

func dedupPartitions() panel {
	return panel{title: "Dedup partitions", unit: "short",
		queries: []query{{"partitions", "max(" + sel(m.DedupPartitionCount) + ")"}}}
}

func dedupOutOfRange() panel {
	return panel{title: "Events outside the dedup partitions", unit: "short",
		queries: []query{{"out of range", "sum(" + increase(m.DedupOutOfRangeTotal, "$__rate_interval") + ")"}}}
}

func batchSize() panel {
	return panel{title: "Events per billing transaction", unit: "short", queries: []query{{"mean batch size",
		"sum(" + rate(m.BatchSizeEvents+"_sum") + ") / sum(" + rate(m.BatchSizeEvents+"_count") + ")"}}}
}

func logEndVsCommitted() panel {
	return panel{title: "Log end vs committed offset per partition", unit: "short", queries: []query{
		{"log end {{topic}}/{{partition}}", perPartition(m.KafkaLogEndOffset)},
		{"committed {{topic}}/{{partition}}", perPartition(m.KafkaCommittedOffset)},
	}}
}

func lagQueryAge() panel {
	return panel{title: "Age of the last successful lag query", unit: "s",
		queries: []query{{"{{pod}}", "max by (pod) (time() - " + sel(m.KafkaLagLastSuccess) + ")"}}}
}

func eventAge() panel {
	return panel{title: "Event age at commit (record timestamp to commit)", unit: "s", queries: []query{
		{"p50", quantile("0.5", m.EventAgeSeconds)},
		{"p99", quantile("0.99", m.EventAgeSeconds)},
	}}
}

func dlqRecords() panel {
	return panel{title: "Dead-letter records not yet replayed", unit: "short",
		queries: []query{{"records", "max(" + sel(m.DLQRecordsPending) + ")"}}}
}

func dlqOldestVsRetention() panel {
	return panel{title: "Oldest dead-letter record vs topic retention", unit: "s", queries: []query{
		{"oldest record", "max(" + sel(m.DLQOldestRecordAge) + ")"},
		{"retention", "max(" + sel(m.DLQRetentionSeconds) + ")"},
	}}
}

// ledgerClaims is the completer's work queue: the claims it has yet to
// settle (pending) and those it gave up on for an operator (blocked). The
// completer sets these gauges on each pass.
func ledgerClaims() panel {
	return panel{title: "Ledger claims needing attention", unit: "short",
		queries: []query{{"{{status}}", "max by (status) (" + sel(m.LedgerClaimCount) + ")"}}}
}

func oldestPendingClaim() panel {
	return panel{title: "Oldest pending ledger claim", unit: "s",
		queries: []query{{"oldest pending", "max(" + sel(m.LedgerOldestPendingAge) + ")"}}}
}

// partitionsOwned is each replica's share of the topic, and how many
// partitions some replica owns.
func partitionsOwned() panel {
	return panel{title: "Partitions owned per replica", unit: "short", queries: []query{
		{"{{pod}}", "sum by (pod) (" + sel(m.KafkaPartitionOwned) + ")"},
		{"owned partitions of {{topic}}", "count by (topic) (" + sel(m.KafkaPartitionOwned) + " == 1)"},
	}}
}

// operatorPause is billing-consumer pause in force (1), and for how long.
func operatorPause() panel {
	return panel{title: "Operator pause", unit: "short", queries: []query{
		{"paused {{namespace}}", "max by (namespace) (" + sel(m.Paused) + ")"},
		{"minutes paused {{namespace}}", "max by (namespace) (" + sel(m.PausedSeconds) + ") / 60"},
	}}
}

// parkedEvents is the events whose record is committed while the
// completer owns their claim (SPEC §10).
func parkedEvents() panel {
	return panel{title: "Parked events (the completer owns their claim)", unit: "short",
		queries: []query{{"parked", "max(" + sel(m.ParkedEventsCount) + ")"}}}
}

// unownedPartitions is the partitions no member of the group is assigned,
// by the brokers' view, and their lag: records nobody consumes (all of
// them for a moment while the group rebalances; the lowest reading across
// replicas, as the BillingConsumerPartitionsUnowned alert reads it).
func unownedPartitions() panel {
	return panel{title: "Partitions no member owns (brokers' view)", unit: "short", queries: []query{
		{"unowned partitions of {{topic}}", "min by (topic, group) (" + sel(m.KafkaPartitionsUnowned) + ")"},
		{"their lag, {{topic}}", "min by (topic, group) (" + sel(m.KafkaPartitionsUnownedLag) + ")"},
	}}
}

// positionWritesFailed is the failed writes of the database's positions
// per second: each stopped the offset commit it preceded, so while it is
// above zero the committed offsets stand still (docs/design.md, Positions).
func positionWritesFailed() panel {
	return panel{title: "Position writes failed (each stops an offset commit), per second", unit: "ops", queries: []query{
		{"{{pod}}", "sum by (pod) (" + rate(m.PositionWritesFailed) + ")"},
	}}
}

// failoverHeal is the failover heal (docs/design.md, "The heal"): while a
// replica holds billing for one, the records it re-decided because the
// database lost their decisions and the orders it blocked for an operator,
// over the dashboard's range.
func failoverHeal() panel {
	return panel{title: "Failover heal (billing held; records re-decided and orders blocked over the range)", unit: "short", queries: []query{
		{"healing {{pod}}", "max by (pod) (" + sel(m.FailoverHealing) + ")"},
		{"records re-decided", "sum (" + increase(m.FailoverRewound, "$__range") + ")"},
		{"orders blocked", "sum (" + increase(m.FailoverBlocked, "$__range") + ")"},
	}}
}

// completerActivity is what the completer's passes do to the claims they
// take up, and how the deferred events are decided, per second, by result.
func completerActivity() panel {
	return panel{title: "Completer activity (claims settled, deferred events decided, per second)", unit: "reqps", queries: []query{
		{"{{result}}", "sum by (result) (" + rate(m.CompleterSettled) + ")"},
		{"deferred {{result}}", "sum by (result) (" + rate(m.DeferredDecided) + ")"},
	}}
}
