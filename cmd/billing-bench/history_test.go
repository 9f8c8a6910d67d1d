package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// res builds a result with the figures the tables and targets read.
func res(mode string, latency time.Duration, rate, cpuUS, allocs float64) result {
	return result{Mode: mode, Latency: latency, Backlog: 1000, TP: throughput{Rate: rate},
		Cost: cost{Events: 1000, CPU: cpuUS * 1000 / 1e6, Mallocs: allocs * 1000, AllocBytes: 1024 * 1000}, PeakRSS: 60e6}
}

// A run's JSON, read back, gives the next run its previous table; no file
// yet is no previous run, and a file that is not such JSON is an error.
func TestPreviousRunRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "benchmarks.json")
	if prev, err := readPrevious(path); prev != nil || err != nil {
		t.Fatalf("no file: %v, %v; want nil, nil", prev, err)
	}
	old := report{env: machine{Consumer: "billing-consumer old", LoadAvg: "1.0 1.0 1.0"},
		results: []result{res("default", 0, 13046, 128, 310), res("default", 20*time.Millisecond, 7471, 145, 330)}}
	if err := writeJSON(path, old.json(t0)); err != nil {
		t.Fatal(err)
	}
	prev, err := readPrevious(path)
	if err != nil || prev == nil || prev.Consumer != "billing-consumer old" || !prev.Date.Equal(t0) || len(prev.Results) != 2 {
		t.Fatalf("read back %+v, %v", prev, err)
	}
	now := report{previous: prev, results: []result{res("default", 0, 26000, 58, 120), res("sequential", 0, 700, 700, 400)}}
	var b strings.Builder
	now.previousMarkdown(&b)
	md := b.String()
	if !strings.Contains(md, "billing-consumer old") || !strings.Contains(md, "| default | 0 ms | 13046 | 26000 | 128 | 58 | 310 | 120 |") {
		t.Errorf("previous table lacks the old run or its row beside the new one:\n%s", md)
	}
	if strings.Contains(md, "| sequential |") {
		t.Errorf("a row without a previous figure:\n%s", md)
	}
	// The README test reads the results table by its bold events/s: the
	// previous table must not look like it.
	if regexp.MustCompile(`(?m)^\| (sequential|default) \| (\d+ ms) \| \*\*(\d+)\*\* \|`).MatchString(md) {
		t.Errorf("the previous table would be read as the results table:\n%s", md)
	}
	if !strings.Contains(now.comparisonSummary(), "13046 → 26000 events/s at 0 ms") {
		t.Errorf("README line on the previous run: %q", now.comparisonSummary())
	}
	if err := os.WriteFile(path, []byte("# not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readPrevious(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("bad JSON: %v, want an error naming the file", err)
	}
}

// Without -baseline the baseline targets say "not measured"; with it,
// they compare with the baseline's runs and say met or not met honestly.
func TestIssue14Targets(t *testing.T) {
	verdicts := func(r report) map[string]string {
		out := map[string]string{}
		for _, tg := range r.issue14Targets() {
			out[tg.name] = tg.verdict() + " " + tg.measured
		}
		return out
	}
	now := []result{res("default", 0, 20000, 58, 140), res("default", 20*time.Millisecond, 12000, 75, 160),
		res("sequential", 20*time.Millisecond, 45, 700, 400)}
	v := verdicts(report{results: now})
	for name, want := range map[string]string{
		"default, 0 ms: <= 60 µs CPU per event":                      "met 58 µs",
		"default, 20 ms: <= 70 µs CPU per event":                     "NOT met 75 µs",
		"default/sequential at 20 ms: >= 200x":                       "met 267x",
		"default, 0 ms: events/s >= 1.8x the baseline":               "not measured no -baseline run",
		"default: allocations per event at most half the baseline's": "not measured no -baseline run",
	} {
		if v[name] != want {
			t.Errorf("without baseline, %q: %q, want %q", name, v[name], want)
		}
	}
	base := []result{res("default", 0, 10000, 128, 300), res("default", 20*time.Millisecond, 7000, 145, 310)}
	v = verdicts(report{results: now, baseline: base})
	for name, want := range map[string]string{
		"default, 0 ms: events/s >= 1.8x the baseline":               "met 2.00x (20000 vs 10000)",
		"default, 20 ms: events/s >= 1.8x the baseline":              "NOT met 1.71x (12000 vs 7000)",
		"default: allocations per event at most half the baseline's": "NOT met 0.47x at 0 ms, 0.52x at 20 ms",
	} {
		if v[name] != want {
			t.Errorf("with baseline, %q: %q, want %q", name, v[name], want)
		}
	}
	var b strings.Builder
	report{results: now, baseline: base}.baselineMarkdown(&b)
	if !strings.Contains(b.String(), "| 0 ms | 10000 | 20000 | 2.00× | 128 | 58 | 0.45× | 300 | 140 | 0.47× |") {
		t.Errorf("before/after table:\n%s", b.String())
	}
	if strings.Contains(b.String(), "bounded by CPU") {
		t.Errorf("a met ratio, or runs without their CPU use, get no ceiling paragraph:\n%s", b.String())
	}
}

// When the events/s ratio misses its target on a CPU-bound machine, the
// report says what the target leaves for the consumer, from the CPU every
// process spent per event.
func TestRateCeiling(t *testing.T) {
	now := res("default", 0, 15000, 55, 115)
	now.CPU = cpuUse{Consumer: 0.825, Postgres: 0.555, Kafka: 0.045, Harness: 0.465, Idle: 0.1} // 55 + 37 + 3 + 31 µs per event
	base := res("default", 0, 12500, 72, 312)
	base.CPU = cpuUse{Consumer: 0.9, Postgres: 0.6, Kafka: 0.05, Harness: 0.4, Idle: 0.05} // 72 + 48 + 4 + 32 µs
	r := report{env: machine{CPUs: 2}, results: []result{now}, baseline: []result{base}}
	var b strings.Builder
	r.baselineMarkdown(&b)
	want := "spent 156 µs before, 72 of them in the consumer, and 126 µs after, 55 in the consumer. " +
		"1.8× the baseline's events/s is 22500/s, which allows at most 89 µs per event in all on 2 cores; " +
		"Postgres, Kafka, the harness and the simulator alone spent 71 µs per event in this run, which leaves the consumer 18 µs."
	if !strings.Contains(b.String(), want) {
		t.Errorf("ceiling paragraph:\n%s\nwant it to contain:\n%s", b.String(), want)
	}
	r.baseline[0].TP.Rate = 9000 // 15000 / 9000 = 1.67: still missed, a smaller budget
	now.CPU.Postgres = 1.5
	r.results[0] = now
	b.Reset()
	r.baselineMarkdown(&b)
	if !strings.Contains(b.String(), "no consumer could meet it on this machine") {
		t.Errorf("others above the budget:\n%s", b.String())
	}
}

// The sweep's target compares each point with the mean of the three.
func TestFlatness(t *testing.T) {
	sweep := []result{res("default", 0, 1, 100, 1), res("default", 0, 1, 110, 1), res("default", 0, 1, 120, 1)}
	lo, hi, dev, ok := flatness(sweep)
	if !ok || lo != 100 || hi != 120 || dev < 0.0909 || dev > 0.0910 {
		t.Errorf("flatness = %v, %v, %v, %v; want 100, 120, 1/11, true", lo, hi, dev, ok)
	}
	if ts := (report{sweep: sweep}).sweepTargets(); len(ts) != 1 || !ts[0].met {
		t.Errorf("±9%%: %+v, want met", ts)
	}
	sweep[2] = res("default", 0, 1, 140, 1) // mean 116.7: 140 is 20% above
	if ts := (report{sweep: sweep}).sweepTargets(); len(ts) != 1 || ts[0].met {
		t.Errorf("±20%%: %+v, want not met", ts)
	}
	if _, _, _, ok := flatness(sweep[:1]); ok {
		t.Error("one point is not a line")
	}
}

// The report and the README summary render every part of a full run: the
// results with their cost per event, the before/after table, the sweep
// and the recovery stages.
func TestReportRendersEveryPart(t *testing.T) {
	rec := recovery{Rate: 1000, Settings: map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "10s"}, Charges: 5000,
		Stages: []stage{{Name: "crash: SIGKILL of one of two replicas", AllProgress: 8 * time.Second, LongestStall: 8 * time.Second},
			{Name: "rolling restart: SIGTERM of one, a new one started", AllProgress: time.Second, LongestStall: 2 * time.Second}}}
	r := report{env: machine{CPUs: 2, Consumer: "billing-consumer new", BaselineConsumer: "billing-consumer old"},
		opts:     options{poll: 20 * time.Millisecond},
		results:  []result{res("sequential", 20*time.Millisecond, 45, 700, 400), res("default", 0, 20000, 58, 140), res("default", 20*time.Millisecond, 12000, 66, 150)},
		baseline: []result{res("default", 0, 10000, 128, 300), res("default", 20*time.Millisecond, 6000, 145, 310)},
		sweep:    []result{res("default", 0, 1, 57, 1), res("default", 0, 1, 58, 1), res("default", 0, 1, 59, 1)},
		recovery: []recovery{rec}}
	md := r.markdown("")
	for _, want := range []string{
		"| default | 0 ms | **20000** | 58 | 140 | 1.0 |",
		"### Before and after, in this sitting", "| 20 ms | 6000 | 12000 | 2.00× |",
		"### Cost by backlog size", "| 1000 records | 1 | **58** |",
		"## Recovery from a crashed replica", "| under test | crash: SIGKILL of one of two replicas | **8.0 s** | 8.0 s |",
		"- The binary under test ran with its defaults BILLING_KAFKA_SESSION_TIMEOUT=10s; its run charged each committed order exactly once (5000 orders checked).",
		"| crash of one of two replicas: every partition advancing again <= 10s | 8.0 s | met |",
		"| CPU per event flat (±10%) across the 3 backlog sizes | 57–59 µs/event (±2%) | met |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("docs/benchmarks.md lacks %q", want)
		}
	}
	// TestReadmeSummaryMatchesTheReport reads the pgbench table by these
	// rows: no other table may look like it.
	if m := regexp.MustCompile(`(?m)^\| (\d+) \| \d+ \| \*\*(\d+)\*\* \|`).FindString(md); m != "" {
		t.Errorf("a row looks like pgbench's: %q", m)
	}
	sum := r.readmeSummary()
	for _, want := range []string{
		"| default | 0 ms | **20000** | 58 | 140 |", "| 0 ms | 10000 → 20000 (2.00×) | 128 → 58 | 300 → 140 |",
		"CPU per event by backlog size (default, 0 ms): 57 µs at 1k records, 58 µs", "after a SIGKILL of one, every partition was advancing again after **8.0 s**",
		"stalled a partition for at most **2.0 s**",
	} {
		if !strings.Contains(sum, want) {
			t.Errorf("README summary lacks %q:\n%s", want, sum)
		}
	}
}

// Of repeated drains the median one is reported, with the range of all,
// the largest RSS, and every drain's problems and checked charges.
func TestMedianRun(t *testing.T) {
	a, b, c := res("default", 0, 15000, 50, 115), res("default", 0, 12000, 60, 115), res("default", 0, 18000, 45, 115)
	a.Charges, b.Charges, c.Charges = 100, 100, 100
	b.PeakRSS = 130e6
	c.problems = []string{"order 7 charged twice"}
	med := medianRun([]result{a, b, c})
	if med.TP.Rate != 15000 || med.Cost.CPUPerEvent() != 50 {
		t.Errorf("median run: %.0f events/s, %.0f µs; want 15000, 50", med.TP.Rate, med.Cost.CPUPerEvent())
	}
	if got := med.spread(spreadRate) + med.spread(spreadCPU); got != " (12000–18000) (45–60)" {
		t.Errorf("spread %q", got)
	}
	if med.PeakRSS != 130e6 || med.Charges != 300 || len(med.problems) != 1 {
		t.Errorf("peak RSS %d, charges %d, problems %v; want 130 MB, 300, the third drain's", med.PeakRSS, med.Charges, med.problems)
	}
	if one := medianRun([]result{a}); one.spread(spreadRate) != "" || one.TP.Rate != 15000 {
		t.Errorf("a single drain: %.0f events/s, spread %q", one.TP.Rate, one.spread(spreadRate))
	}
}
