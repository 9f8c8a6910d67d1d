package main

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// result is the measurement of one mode at one provider latency.
type result struct {
	Mode    string
	Latency time.Duration
	// Baseline marks a run of the -baseline binary (the code before the
	// change), measured in the same sitting.
	Baseline bool
	Backlog  int           // records produced before the consumer started
	TP       throughput    // draining the backlog
	CPU      cpuUse        // while draining the backlog, in cores
	Cost     cost          // the consumer's CPU and allocations per committed event while draining
	Stats    consumerStats // the consumer's metrics after the backlog
	// InFlight is the mean number of charges in progress at the simulator
	// while the backlog drained (sampled every 20 ms after the first
	// commit): how many of the consumer's slots were waiting on the provider.
	InFlight float64
	// Steady offered load and the produce-to-commit latency under it.
	SteadyRate     float64
	SteadyRecords  int
	P50, P99       time.Duration
	LatencyMissing int
	PeakRSS        int64 // bytes, the largest VmHWM of the run's processes
	// Spread is every drain of the backlog (-repeat), slowest first; the
	// result is the median one's.
	Spread   []runSpread
	Charges  int           // orders verified charged exactly once, both phases
	Failing  *failingStats // the failing orders of a run of the failing row (failing.go); nil for the others
	problems []string
	notes    []string
}

// binLabel is " (baseline)" for a run of the -baseline binary, else "".
func (r result) binLabel() string {
	if r.Baseline {
		return " (baseline)"
	}
	return ""
}

func (r result) line() string {
	s := fmt.Sprintf("  %-10s %5v%s: %7.0f events/s (%d finished in the %.1fs window; %d committed), %.0f µs CPU, %.0f allocs, %.1f KiB per event; ",
		r.Mode, r.Latency, r.binLabel(), r.TP.Rate, r.Cost.Events, r.Cost.Window.Seconds(), r.TP.Committed,
		r.Cost.CPUPerEvent(), r.Cost.AllocsPerEvent(), r.Cost.BytesPerEvent()/1024)
	if r.SteadyRecords > 0 {
		s += fmt.Sprintf("steady %.0f/s: p50 %v p99 %v, ", r.SteadyRate, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond))
	}
	s += fmt.Sprintf("peak RSS %.0f MB, %d charges verified", float64(r.PeakRSS)/1e6, r.Charges)
	for _, p := range r.problems {
		s += "\n    FAILED: " + p
	}
	for _, n := range r.notes {
		s += "\n    note: " + n
	}
	return s
}

// medianRun returns the run with the median events/s (the upper one of an
// even count), with Spread holding every run's, slowest first, the
// largest peak RSS of all, and every run's problems, notes and checked
// charges.
func medianRun(runs []result) result {
	runs = slices.Clone(runs)
	slices.SortStableFunc(runs, func(a, b result) int { return cmp.Compare(a.TP.Rate, b.TP.Rate) })
	med := runs[len(runs)/2]
	med.Spread, med.problems, med.notes, med.Charges = nil, nil, nil, 0
	for _, x := range runs {
		med.Spread = append(med.Spread, runSpread{Rate: x.TP.Rate, CPUPerEvent: x.Cost.CPUPerEvent()})
		med.PeakRSS = max(med.PeakRSS, x.PeakRSS)
		med.problems = append(med.problems, x.problems...)
		med.notes = append(med.notes, x.notes...)
		med.Charges += x.Charges
	}
	med.notes = slices.Compact(med.notes)
	return med
}

// runSpread is what one drain of a repeated backlog measured.
type runSpread struct {
	Rate, CPUPerEvent float64
}

// spread is " (lo–hi)" of f over the drains, empty for a single drain.
func (r result) spread(f func(runSpread) float64) string {
	if len(r.Spread) < 2 {
		return ""
	}
	lo, hi := f(r.Spread[0]), f(r.Spread[0])
	for _, s := range r.Spread[1:] {
		lo, hi = min(lo, f(s)), max(hi, f(s))
	}
	return fmt.Sprintf(" (%.0f–%.0f)", lo, hi)
}

func spreadRate(s runSpread) float64 { return s.Rate }
func spreadCPU(s runSpread) float64  { return s.CPUPerEvent }
