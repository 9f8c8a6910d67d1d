package main

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(ms int, committed ...int64) sample {
	return sample{at: t0.Add(time.Duration(ms) * time.Millisecond), committed: committed}
}

func TestMeasureThroughput(t *testing.T) {
	samples := []sample{
		at(0, 0, 0), at(20, 0, 0), // group joining
		at(1000, 100, 50),  // first advance: 150 done before the window
		at(1020, 100, 50),  //
		at(2000, 300, 250), //
		at(3000, 500, 400), // last advance: 900
		at(3020, 500, 400), // idle afterwards: not in the window
	}
	tests := []struct {
		name      string
		until     time.Time
		rate      float64
		committed int64
		window    time.Duration
	}{
		{"drained", time.Time{}, 750.0 / 2, 900, 2 * time.Second},
		{"time box", t0.Add(2500 * time.Millisecond), 400, 550, time.Second},
		{"time box before any commit", t0.Add(10 * time.Millisecond), 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := measureThroughput(samples, tt.until)
			if got.Rate != tt.rate || got.Committed != tt.committed || got.Window != tt.window {
				t.Errorf("got rate %v, committed %d, window %v; want %v, %d, %v", got.Rate, got.Committed, got.Window, tt.rate, tt.committed, tt.window)
			}
		})
	}
}

func TestCommitLatencies(t *testing.T) {
	samples := []sample{at(0, 0, 0), at(20, 1, 0), at(40, 1, 0), at(60, 3, 1)}
	recs := []record{
		{partition: 0, offset: 0, time: t0.Add(-5 * time.Millisecond)}, // committed at 20 ms
		{partition: 0, offset: 2, time: t0.Add(10 * time.Millisecond)}, // committed at 60 ms
		{partition: 1, offset: 0, time: t0.Add(30 * time.Millisecond)}, // committed at 60 ms
		{partition: 1, offset: 1, time: t0},                            // never seen committed
	}
	got, missing := commitLatencies(samples, recs)
	want := []time.Duration{25 * time.Millisecond, 30 * time.Millisecond, 50 * time.Millisecond}
	if missing != 1 || len(got) != len(want) {
		t.Fatalf("got %v, %d missing; want %v, 1 missing", got, missing, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("latency %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %v, want 50ms", p)
	}
	if p := percentile(d, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v, want 99ms", p)
	}
	if p := percentile(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing = %v, want 0", p)
	}
}

func TestChartIsWellFormedSVG(t *testing.T) {
	var results []result
	for _, m := range modes {
		for i, l := range latencies {
			results = append(results, result{Mode: m.name, Latency: l, TP: throughput{Rate: float64(10 * (i + 1))}})
		}
	}
	svg := chartSVG(results)
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
	}
	if got := strings.Count(svg, "<rect x="); got != len(results)+len(modes) {
		t.Errorf("%d bars and legend boxes, want %d", got, len(results)+len(modes))
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 4217.4: "4,217", 1234567: "1,234,567"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}
