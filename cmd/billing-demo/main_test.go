package main

import (
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// The demo fails when the consumer's own counts differ from the plan's,
// row by row and in total, and passes when they agree.
func TestCountMismatches(t *testing.T) {
	plan := harness.Plan{
		Records:  make([]kafka.Message, 10),
		Outcomes: map[string]int{"charged": 6, "duplicate": 2, "duplicate_order": 1, "dlq": 1},
	}
	same := map[string]float64{"charged": 6, "duplicate": 2, "duplicate_order": 1, "dlq": 1}
	if got := countMismatches(plan, same); len(got) != 0 {
		t.Errorf("equal counts: %q, want none", got)
	}
	off := map[string]float64{"charged": 5, "duplicate": 3, "duplicate_order": 1, "dlq": 1}
	got := strings.Join(countMismatches(plan, off), "\n")
	for _, want := range []string{"counted 5 charged events, the plan expects 6", "counted 3 duplicate events, the plan expects 2"} {
		if !strings.Contains(got, want) {
			t.Errorf("mismatches %q lack %q", got, want)
		}
	}
	missing := map[string]float64{"charged": 6, "duplicate": 2, "duplicate_order": 1}
	if got := strings.Join(countMismatches(plan, missing), "\n"); !strings.Contains(got, "counted 0 dlq events") ||
		!strings.Contains(got, "counted 9 events in all, 10 records were published") {
		t.Errorf("a missing row: %q", got)
	}
}
