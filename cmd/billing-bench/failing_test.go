package main

import (
	"strings"
	"testing"
	"time"
)

// One order in failingEvery of a phase's range fails, whatever the range.
func TestFailingShare(t *testing.T) {
	f := &failing{first: 1_234_567}
	n := 0
	for o := f.first; o < f.first+100_000; o++ {
		if f.fails(o) {
			n++
		}
	}
	if n != 100 {
		t.Fatalf("%d of 100,000 orders fail; want 100 (0.1%%)", n)
	}
	if !f.recoveredAt().IsZero() {
		t.Fatal("recovered before any failing answer")
	}
	if f.unavailable(f.first) {
		t.Fatal("a healthy order answered 503")
	}
	if !f.unavailable(f.first+failingEvery/2) || f.recoveredAt().IsZero() {
		t.Fatal("a failing order not answered 503, or the failure's clock not started by it")
	}
}

// The row's targets: healthy events/s within 10% of the drain without,
// healthy p99 produce→commit below BILLING_PARK_AFTER plus the commit
// interval, parked orders charged within 30 s of the recovery.
func TestFailingTargets(t *testing.T) {
	row := func(clean, failed float64, p99, slowest time.Duration) report {
		fr := failingRun{ParkAfter: 30 * time.Second, CommitInterval: time.Second}
		fr.Clean.TP.Rate, fr.Failing.TP.Rate = clean, failed
		fr.Steady.P99 = p99
		fr.Steady.Failing = &failingStats{Recovery: []time.Duration{time.Second, slowest}}
		fr.Failing.Failing = &failingStats{}
		return report{failing: &fr}
	}
	for _, tc := range []struct {
		name string
		r    report
		want []bool
	}{
		{"all met", row(10000, 9500, 30500*time.Millisecond, 12*time.Second), []bool{true, true, true}},
		{"slow, late commits, late charge", row(10000, 8000, 31*time.Second, 31*time.Second), []bool{false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := tc.r.failingTargets()
			if len(ts) != len(tc.want) {
				t.Fatalf("%d targets; want %d", len(ts), len(tc.want))
			}
			for i, tg := range ts {
				if tg.met != tc.want[i] {
					t.Errorf("%s: met %v (measured %s); want %v", tg.name, tg.met, tg.measured, tc.want[i])
				}
			}
			var b strings.Builder
			tc.r.failingMarkdown(&b)
			if !strings.Contains(b.String(), "## Orders failing at the provider") {
				t.Errorf("no section in the report:\n%s", b.String())
			}
		})
	}
}
