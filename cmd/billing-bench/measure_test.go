package main

import (
	"math"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*max(1, math.Abs(b)) }

func TestPerEventDividesTheWindowByTheEventsFinishedInIt(t *testing.T) {
	t0 := time.Now()
	a := reading{at: t0, finished: 1000, cpu: 2, mallocs: 1e5, allocs: 1e7, pgCPU: 1, wal: 1e6}
	z := reading{at: t0.Add(2 * time.Second), finished: 3000, cpu: 2.2, mallocs: 3e5, allocs: 3e7, pgCPU: 1.1, wal: 3e6}
	var d drain
	d.perEvent(a, z)
	got := []float64{float64(d.Events), d.WindowS, d.EventsPerS, d.CPU, d.PGCPU, d.WAL, d.Allocs, d.AllocBytes}
	want := []float64{2000, 2, 1000, 100, 50, 1000, 100, 10000}
	for i := range want {
		if !near(got[i], want[i]) {
			t.Errorf("figure %d = %v, want %v (all: %v)", i, got[i], want[i], got)
		}
	}
	var none drain
	if none.perEvent(a, a); none.EventsPerS != 0 || none.CPU != 0 {
		t.Errorf("no event finished, got %+v", none)
	}
}

func TestMedianRatioPairsTheDrainsWhicheverRanFirst(t *testing.T) {
	under := func(cpu float64) drain { return drain{Binary: "under test", CPU: cpu} }
	base := func(cpu float64) drain { return drain{Binary: "baseline", CPU: cpu} }
	// Pairs AB, BA, AB, BA with ratios 1.1, 0.9, 1.2, 1.0.
	drains := []drain{under(110), base(100), base(100), under(90), under(120), base(100), base(50), under(50)}
	if got := medianRatio(drains, compared[1]); !near(got, 1.05) {
		t.Errorf("median of the paired ratios = %v, want 1.05", got)
	}
	if got := medianRatio([]drain{under(1), under(2)}, compared[1]); got != 0 {
		t.Errorf("drains of one binary have no ratio, got %v", got)
	}
}

func TestSummarizeKeepsTheMedianDrainAndTheLargestPeaks(t *testing.T) {
	runs := []drain{
		{EventsPerS: 3, CPU: 30, PeakRSS: 10, PeakFDs: 7},
		{EventsPerS: 1, CPU: 10, PeakHeap: 50, Problems: []string{"x"}},
		{EventsPerS: 2, CPU: 20, PeakGoroutines: 9, Problems: []string{"y"}},
	}
	s := summarize(runs)
	if s.EventsPerS != 2 || s.CPU != 20 || s.PeakRSS != 10 || s.PeakHeap != 50 || s.PeakGoroutines != 9 || s.PeakFDs != 7 || len(s.Problems) != 2 {
		t.Errorf("summarize = %+v", s)
	}
	if runs[2].PeakRSS != 0 {
		t.Error("summarize changed its input")
	}
}

func TestStageMeasuresTheOrdersSentInIt(t *testing.T) {
	t0 := time.Now()
	s := stage{from: t0, to: t0.Add(time.Second)}
	sent, charged := map[int64]time.Time{}, map[int64]time.Time{}
	for order, wait := range map[int64]time.Duration{1: 10, 2: 20, 3: 30, 4: 1000} {
		sent[order] = t0.Add(time.Duration(order) * time.Millisecond)
		charged[order] = sent[order].Add(wait * time.Millisecond)
	}
	sent[5] = t0.Add(500 * time.Millisecond) // never charged: the exactly-once check's
	sent[6], charged[6] = t0.Add(-time.Millisecond), t0.Add(time.Hour)
	s.measure(sent, charged)
	if s.Orders != 5 || !near(s.P50MS, 20) || !near(s.P99MS, 1000) || !near(s.MaxMS, 1000) {
		t.Errorf("stage = %+v", s)
	}
}

func TestParseOptions(t *testing.T) {
	t.Setenv("BILLING_DATABASE_URL", "postgres://x@localhost/db")
	t.Setenv("BENCH_BROKERS", "localhost:9092")
	o, err := parseOptions([]string{"-baseline", "bin/old", "-scale", "0.1", "-only", "drain,recovery"})
	if err != nil {
		t.Fatal(err)
	}
	if o.repeat != 4 || o.stageFor != 10*time.Second || !o.selected("recovery") || o.selected("partitions") {
		t.Errorf("options = %+v", o)
	}
	if _, err := parseOptions([]string{"-only", "drains"}); err == nil {
		t.Error("-only drains (no such part) accepted")
	}
}
