package monitoring

import (
	"strings"
	"testing"
	"time"
)

// TestScaled checks the scaling on the real rules: the factor is derived
// from their shortest duration, and every duration of an expression and
// every for: is divided by it.
func TestScaled(t *testing.T) {
	spec, err := Rules("../base")
	if err != nil {
		t.Fatal(err)
	}
	f, err := Factor(spec, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if f != 30 {
		t.Errorf("factor %d, want 30 (shortest duration 5m, minimum 10s)", f)
	}
	out, err := Scaled(spec, f)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{
		"deriv(namespace_partition:billing_kafka_consumer_lag:max[30s])",    // [15m]
		"namespace_partition:billing_kafka_committed_offset:max offset 20s", // offset 10m
		"for: 30s", // for: 15m
		"increase(billing_dedup_out_of_range_total{job=\"billing-consumer\"}[2m])", // [1h]
		"runbook_url: https://", // rendered: the runbook base URL is in place
	} {
		if !strings.Contains(s, want) {
			t.Errorf("scaled rules lack %q", want)
		}
	}
	for _, unscaled := range []string{"[5m]", "[15m]", "offset 10m", "for: 15m"} {
		if strings.Contains(s, unscaled) {
			t.Errorf("scaled rules still hold %q", unscaled)
		}
	}
}
