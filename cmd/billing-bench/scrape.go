package main

import (
	"context"
	"fmt"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// consumerStats are the consumer's own metrics at the end of a phase.
type consumerStats struct {
	Charged     float64       // billing_events_total{result="charged"}
	Finished    float64       // billing_events_total, every result: the events the consumer has finished
	Retries     float64       // billing_retries_total, all kinds
	PaymentMean time.Duration // mean billing_payment_duration_seconds: the provider call as the consumer saw it
	// Mallocs and AllocBytes are go_memstats_mallocs_total and
	// go_memstats_alloc_bytes_total: the Go collector the binary registers
	// (cmd/billing-consumer/service.go), cumulative since its start.
	Mallocs, AllocBytes float64
}

// scrape reads the consumer's /metrics.
func scrape(ctx context.Context, addr string) (consumerStats, error) {
	var s consumerStats
	families, err := harness.Scrape(ctx, addr)
	if err != nil {
		return s, err
	}
	for name, dst := range map[string]*float64{"go_memstats_mallocs_total": &s.Mallocs, "go_memstats_alloc_bytes_total": &s.AllocBytes} {
		f := families[name]
		if len(f.GetMetric()) != 1 {
			return s, fmt.Errorf("the consumer's /metrics at %s has no %s (is the Go collector registered?)", addr, name)
		}
		*dst = f.GetMetric()[0].GetCounter().GetValue()
	}
	byResult := harness.CounterBy(families["billing_events_total"], "result")
	s.Charged = byResult["charged"]
	for _, v := range byResult {
		s.Finished += v
	}
	if f := families["billing_retries_total"]; f != nil {
		for _, m := range f.GetMetric() {
			s.Retries += m.GetCounter().GetValue()
		}
	}
	if f := families["billing_payment_duration_seconds"]; f != nil && len(f.GetMetric()) == 1 {
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() > 0 {
			s.PaymentMean = time.Duration(h.GetSampleSum() / float64(h.GetSampleCount()) * 1e9)
		}
	}
	return s, nil
}
