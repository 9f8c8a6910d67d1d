package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// PaymentCodes are the payment answers (HTTP status, or "error" for no
// usable answer) whose series exist from the start: the ones the alerts and
// the dashboard select. Other codes appear at their first answer.
var PaymentCodes = []string{"200", "401", "403", "409", "422", "429", "500", "503", "error"}

// CompleterResults are the result label values of CompleterSettled: a
// claim charged or blocked, re-sent with its outcome still unknown
// ("pending"), or released or settled meanwhile, nothing sent ("moved").
var CompleterResults = []string{"charged", "blocked", "pending", "moved"}

// DeferredResults are the result label values of DeferredDecided: how a
// deferred event was decided once the claim it waited on settled (SPEC
// §10) — its own charge, a duplicate or duplicate_order, or a dead-letter
// record (conflict, or permanent for its own charge refused).
var DeferredResults = []string{"charged", "duplicate", "duplicate_order", "dlq"}

// RetryKinds are the error kinds the pipeline retries, whose
// billing_retries_total series exist from the start.
var RetryKinds = []string{fault.Transient.String(), fault.Systemic.String(), fault.Busy.String()}

// Payment records one answer of the payment provider; it has the signature
// of payment.Config.Observe.
func (m *Metrics) Payment(code string, elapsed time.Duration) {
	m.PaymentRequests.WithLabelValues(code).Inc()
	m.PaymentDuration.Observe(elapsed.Seconds())
}

// DedupPass records the processed_event partition count after a
// maintenance pass.
func (m *Metrics) DedupPass(partitions int) { m.DedupPartitions.Set(float64(partitions)) }

// Batch records the size of one billing transaction.
func (m *Metrics) Batch(n int) { m.BatchSize.Observe(float64(n)) }

// Commit returns the consumer.Config.OnCommit of topic and group: it sets
// the committed offset of the partition and observes, for every record the
// commit newly covers, the fetch-to-commit duration and the event age
// (record timestamp to commit; a producer clock ahead of ours counts as 0).
// It is safe for concurrent use, as OnCommit must be.
func (m *Metrics) Commit(topic, group string, now func() time.Time) func(partition int, offset int64, covered []consumer.Timing) {
	return func(partition int, offset int64, covered []consumer.Timing) {
		m.CommittedOffset.WithLabelValues(topic, group, strconv.Itoa(partition)).Set(float64(offset))
		t := now()
		for _, c := range covered {
			m.EventDuration.Observe(t.Sub(c.Fetched).Seconds())
			if !c.Produced.IsZero() {
				m.EventAge.Observe(max(t.Sub(c.Produced), 0).Seconds())
			}
		}
	}
}

// Lag returns the report function of consumer.LagPass for topic and
// group. A successful query sets the lag, committed and log-end gauges of
// every partition and the last-success time. When queries have failed for
// longer than staleAfter, the lag and log-end series of the topic are
// removed: alerts and autoscalers then see no lag rather than a frozen one,
// and billing_kafka_lag_last_success_timestamp_seconds tells why.
func (m *Metrics) Lag(topic, group string, staleAfter time.Duration, now func() time.Time) func([]consumer.PartitionLag, error) {
	var mu sync.Mutex
	last := now() // a fresh process is not stale before its first query
	return func(lags []consumer.PartitionLag, err error) {
		mu.Lock()
		defer mu.Unlock()
		t := now()
		if err != nil {
			if t.Sub(last) > staleAfter {
				m.ConsumerLag.DeletePartialMatch(prometheus.Labels{"topic": topic, "group": group})
				m.LogEndOffset.DeletePartialMatch(prometheus.Labels{"topic": topic})
			}
			return
		}
		last = t
		m.LagLastSuccess.Set(float64(t.UnixMilli()) / 1000)
		for _, l := range lags {
			p := strconv.Itoa(l.Partition)
			m.ConsumerLag.WithLabelValues(topic, group, p).Set(float64(l.Lag))
			m.LogEndOffset.WithLabelValues(topic, p).Set(float64(l.End))
			if l.Committed >= 0 {
				m.CommittedOffset.WithLabelValues(topic, group, p).Set(float64(l.Committed))
			}
		}
	}
}

// Unowned returns the report function of the group's assignment reading
// for topic and group: the partitions no member is assigned and the sum of
// their lag. Both series exist, at 0, from the call on: call it before the
// first scrape.
func (m *Metrics) Unowned(topic, group string) func(unowned int, lag int64) {
	n := m.PartitionsUnowned.WithLabelValues(topic, group)
	l := m.PartitionsUnownedLag.WithLabelValues(topic, group)
	return func(unowned int, lag int64) {
		n.Set(float64(unowned))
		l.Set(float64(lag))
	}
}

// DLQBacklog records the dead-letter records not yet replayed, the age of
// the oldest (zero time: none) and the topic's retention (0: unknown or
// unlimited).
func (m *Metrics) DLQBacklog(records int64, oldest time.Time, retention time.Duration, now time.Time) {
	m.DLQRecords.Set(float64(records))
	age := time.Duration(0)
	if !oldest.IsZero() {
		age = max(now.Sub(oldest), 0)
	}
	m.DLQOldestAge.Set(age.Seconds())
	m.DLQRetention.Set(retention.Seconds())
}
