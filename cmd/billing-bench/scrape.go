package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s, fmt.Errorf("parse metrics: %w", err)
	}
	if f := families["billing_events_total"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "charged" {
					s.Charged = m.GetCounter().GetValue()
				}
			}
		}
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
