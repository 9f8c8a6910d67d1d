package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
)

// TestFirstScrape: every family the rules and the dashboard read is in the
// first scrape, before anything happened, including billing_build_info
// and the payment codes the alerts select.
func TestFirstScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg, "v1.2.3", "abc123")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	// The per-partition gauges have no partition before the first lag
	// query: their label values are not known in advance.
	for _, name := range []string{"billing_events_total", "billing_dlq_total", "billing_event_duration_seconds",
		"billing_payment_requests_total", "billing_payment_duration_seconds", "billing_kafka_lag_last_success_timestamp_seconds",
		"billing_event_age_seconds", "billing_dedup_partitions", "billing_ledger_claims", "billing_ledger_oldest_pending_seconds",
		"billing_dlq_records", "billing_dlq_oldest_record_age_seconds", "billing_dlq_retention_seconds", "billing_build_info",
		"billing_retries_total", "billing_batch_size", "billing_dedup_out_of_range_total"} {
		if !got[name] {
			t.Errorf("%s is not in the first scrape", name)
		}
	}
	want := `
# HELP billing_build_info Always 1; the labels say which build runs.
# TYPE billing_build_info gauge
`
	for _, mf := range mfs {
		if mf.GetName() == "billing_build_info" {
			l := mf.GetMetric()[0].GetLabel()
			if len(l) != 3 || l[0].GetValue() != "abc123" || l[2].GetValue() != "v1.2.3" || !strings.HasPrefix(l[1].GetValue(), "go") {
				t.Errorf("billing_build_info labels %v%s", l, want)
			}
		}
	}
}

// TestLagStaleness: a failed lag query keeps the last numbers only while
// they are younger than staleAfter; after that the lag and log-end series
// go away instead of freezing, and the last-success time stays behind.
func TestLagStaleness(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "dev", "unknown")
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	report := m.Lag("orders", "billing", time.Minute, clock)

	report([]consumer.PartitionLag{{Partition: 0, Committed: 5, End: 9, Lag: 4}, {Partition: 1, Committed: -1, End: 3, Lag: 3}}, nil)
	if v := testutil.ToFloat64(m.ConsumerLag.WithLabelValues("orders", "billing", "0")); v != 4 {
		t.Errorf("lag of partition 0 = %v, want 4", v)
	}
	if v := testutil.ToFloat64(m.LogEndOffset.WithLabelValues("orders", "1")); v != 3 {
		t.Errorf("log end of partition 1 = %v, want 3", v)
	}
	if n := testutil.CollectAndCount(m.CommittedOffset); n != 1 {
		t.Errorf("%d committed-offset series, want 1 (partition 1 has no committed offset)", n)
	}
	if v := testutil.ToFloat64(m.LagLastSuccess); v != 1_000_000 {
		t.Errorf("last success = %v, want 1000000", v)
	}

	now = now.Add(30 * time.Second)
	report(nil, errors.New("broker down"))
	if n := testutil.CollectAndCount(m.ConsumerLag); n != 2 {
		t.Errorf("after a failure within staleAfter: %d lag series, want 2 kept", n)
	}
	now = now.Add(31 * time.Second)
	report(nil, errors.New("broker down"))
	if n := testutil.CollectAndCount(m.ConsumerLag); n != 0 {
		t.Errorf("after failures for longer than staleAfter: %d lag series, want 0", n)
	}
	if n := testutil.CollectAndCount(m.LogEndOffset); n != 0 {
		t.Errorf("after failures for longer than staleAfter: %d log-end series, want 0", n)
	}
	if v := testutil.ToFloat64(m.LagLastSuccess); v != 1_000_000 {
		t.Errorf("last success = %v after failures, want the time of the last success", v)
	}
	report([]consumer.PartitionLag{{Partition: 0, Committed: 9, End: 9}}, nil)
	if n := testutil.CollectAndCount(m.ConsumerLag); n != 1 {
		t.Errorf("after a new success: %d lag series, want 1", n)
	}
}

// TestCommitObserves: a commit sets the partition's committed offset and
// observes the fetch-to-commit duration and the event age of each record.
func TestCommitObserves(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, "dev", "unknown")
	now := time.Unix(2_000_000, 0)
	commit := m.Commit("orders", "billing", func() time.Time { return now })
	commit(3, 42, []consumer.Timing{
		{Produced: now.Add(-10 * time.Minute), Fetched: now.Add(-time.Second)},
		{Produced: now.Add(time.Minute), Fetched: now.Add(-2 * time.Second)}, // producer clock ahead
		{Fetched: now}, // no record timestamp
	})
	if v := testutil.ToFloat64(m.CommittedOffset.WithLabelValues("orders", "billing", "3")); v != 42 {
		t.Errorf("committed offset = %v, want 42", v)
	}
	count, sum := histogram(t, reg, "billing_event_age_seconds")
	if count != 2 || sum != 600 {
		t.Errorf("event age: %d observations summing to %vs, want 2 summing to 600s", count, sum)
	}
	count, sum = histogram(t, reg, "billing_event_duration_seconds")
	if count != 3 || sum != 3 {
		t.Errorf("event duration: %d observations summing to %vs, want 3 summing to 3s", count, sum)
	}
}

func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no %s", name)
	return 0, 0
}

// TestUnowned: both unowned-partition series exist at 0 as soon as the
// service has asked for its report function (before the first scrape),
// and carry each reading.
func TestUnowned(t *testing.T) {
	m := New(prometheus.NewRegistry(), "dev", "unknown")
	report := m.Unowned("orders", "billing")
	n, l := m.PartitionsUnowned.WithLabelValues("orders", "billing"), m.PartitionsUnownedLag.WithLabelValues("orders", "billing")
	if c := testutil.CollectAndCount(m.PartitionsUnowned) + testutil.CollectAndCount(m.PartitionsUnownedLag); c != 2 {
		t.Fatalf("%d unowned series before the first reading, want 2", c)
	}
	if testutil.ToFloat64(n) != 0 || testutil.ToFloat64(l) != 0 {
		t.Fatal("unowned series do not start at 0")
	}
	report(6, 900)
	if testutil.ToFloat64(n) != 6 || testutil.ToFloat64(l) != 900 {
		t.Errorf("after report(6, 900): %v, %v", testutil.ToFloat64(n), testutil.ToFloat64(l))
	}
}
