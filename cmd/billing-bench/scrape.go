package main

import (
	"context"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/harness"
)

// consumerStats are the consumer's own metrics at the end of a phase.
type consumerStats struct {
	Charged     float64       // billing_events_total{result="charged"}
	Retries     float64       // billing_retries_total, all kinds
	PaymentMean time.Duration // mean billing_payment_duration_seconds: the provider call as the consumer saw it
}

// scrape reads the consumer's /metrics.
func scrape(ctx context.Context, addr string) (consumerStats, error) {
	var s consumerStats
	families, err := harness.Scrape(ctx, addr)
	if err != nil {
		return s, err
	}
	s.Charged = harness.CounterBy(families["billing_events_total"], "result")["charged"]
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
