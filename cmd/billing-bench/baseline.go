package main

import (
	"fmt"
	"strings"
	"time"
)

// Issue 14's targets (docs/benchmarks.md, "Targets").
const (
	cpuTarget0        = 60.0 // µs per event, default mode, 0 ms
	cpuTarget20       = 70.0 // µs per event, default mode, 20 ms
	speedupTarget20   = 200  // default / sequential at 20 ms
	rateRatioTarget   = 1.8  // events/s over the baseline's, at 0 and 20 ms
	allocsRatioTarget = 0.5  // allocs per event over the baseline's
)

// findBaseline returns the baseline's run at a provider latency.
func (r report) findBaseline(latency time.Duration) (result, bool) {
	for _, x := range r.baseline {
		if x.Latency == latency {
			return x, true
		}
	}
	return result{}, false
}

// ratio is after/before, 0 when before is 0.
func ratio(after, before float64) float64 {
	if before == 0 {
		return 0
	}
	return after / before
}

// issue14Targets are the targets of issue 14: CPU per event, the speedup
// over the sequential mode, and the ratios to the baseline, which are
// "not measured" without -baseline.
func (r report) issue14Targets() []target {
	var ts []target
	for _, want := range []struct {
		latency time.Duration
		cpu     float64
	}{{0, cpuTarget0}, {20 * time.Millisecond, cpuTarget20}} {
		if x, ok := r.find("default", want.latency); ok {
			c := x.Cost.CPUPerEvent()
			ts = append(ts, target{fmt.Sprintf("default, %s: <= %.0f µs CPU per event", ms(want.latency), want.cpu),
				fmt.Sprintf("%.0f µs", c), c > 0 && c <= want.cpu, false})
		}
	}
	if s, ok := r.speedup(); ok {
		ts = append(ts, target{fmt.Sprintf("default/sequential at 20 ms: >= %dx", speedupTarget20), fmt.Sprintf("%.0fx", s), s >= speedupTarget20, false})
	}
	for _, l := range []time.Duration{0, 20 * time.Millisecond} {
		name := fmt.Sprintf("default, %s: events/s >= %.1fx the baseline", ms(l), rateRatioTarget)
		x, ok1 := r.find("default", l)
		base, ok2 := r.findBaseline(l)
		if !ok1 || !ok2 {
			ts = append(ts, target{name: name, measured: "no -baseline run", unmeasured: true})
			continue
		}
		q := ratio(x.TP.Rate, base.TP.Rate)
		ts = append(ts, target{name, fmt.Sprintf("%.2fx (%.0f vs %.0f)", q, x.TP.Rate, base.TP.Rate), q >= rateRatioTarget, false})
	}
	var worst float64
	var parts []string
	for _, base := range r.baseline {
		if x, ok := r.find("default", base.Latency); ok {
			q := ratio(x.Cost.AllocsPerEvent(), base.Cost.AllocsPerEvent())
			worst = max(worst, q)
			parts = append(parts, fmt.Sprintf("%.2fx at %s", q, ms(base.Latency)))
		}
	}
	name := "default: allocations per event at most half the baseline's"
	if len(parts) == 0 {
		ts = append(ts, target{name: name, measured: "no -baseline run", unmeasured: true})
	} else {
		ts = append(ts, target{name, strings.Join(parts, ", "), worst > 0 && worst <= allocsRatioTarget, false})
	}
	return ts
}

// baselineMarkdown writes the before/after table of -baseline: the
// default mode of both binaries, measured alternately in this sitting.
func (r report) baselineMarkdown(b *strings.Builder) {
	if len(r.baseline) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n### Before and after, in this sitting\n\nThe default mode of the baseline binary (%s, the code before this change) measured the same way, "+
		"each of its runs right after the same run of the binary under test (%s):\n\n", r.env.BaselineConsumer, r.env.Consumer)
	p("| provider latency | events/s before | events/s after | ratio | CPU µs/event before | after | ratio | allocs/event before | after | ratio | peak RSS before | after |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, base := range r.baseline {
		x, ok := r.find("default", base.Latency)
		if !ok {
			continue
		}
		p("| %s | %.0f%s | %.0f%s | %.2f× | %.0f%s | %.0f%s | %.2f× | %.0f | %.0f | %.2f× | %s | %s |\n", ms(base.Latency),
			base.TP.Rate, base.spread(spreadRate), x.TP.Rate, x.spread(spreadRate), ratio(x.TP.Rate, base.TP.Rate),
			base.Cost.CPUPerEvent(), base.spread(spreadCPU), x.Cost.CPUPerEvent(), x.spread(spreadCPU), ratio(x.Cost.CPUPerEvent(), base.Cost.CPUPerEvent()),
			base.Cost.AllocsPerEvent(), x.Cost.AllocsPerEvent(), ratio(x.Cost.AllocsPerEvent(), base.Cost.AllocsPerEvent()),
			mb(base.PeakRSS), mb(x.PeakRSS))
	}
	r.rateCeiling(p)
}

// rateCeiling writes, for each provider latency where both binaries used
// nearly all the CPU and the events/s ratio missed rateRatioTarget, what
// that target asks of the consumer: the machine does cpus / (CPU per event
// of every process) events/s, so the target caps the CPU the whole machine
// may spend per event, and what Postgres, Kafka, the harness and the
// simulator spent in this run is left out of the consumer's share.
func (r report) rateCeiling(p func(format string, args ...any)) {
	cpus := float64(r.env.CPUs)
	for _, base := range r.baseline {
		x, ok := r.find("default", base.Latency)
		if !ok || base.TP.Rate <= 0 || x.TP.Rate <= 0 || ratio(x.TP.Rate, base.TP.Rate) >= rateRatioTarget ||
			!base.CPU.saturated(r.env.CPUs) || !x.CPU.saturated(r.env.CPUs) {
			continue
		}
		perEvent := func(cores, rate float64) float64 { return cores / rate * 1e6 } // µs
		want := rateRatioTarget * base.TP.Rate
		budget := cpus / want * 1e6
		others := perEvent(x.CPU.bench()-x.CPU.Consumer, x.TP.Rate)
		p("\nAt %s both binaries were bounded by CPU (%.2f and %.2f of %d cores idle): per event the whole machine (consumer, Postgres, Kafka, "+
			"harness and simulator) spent %.0f µs before, %.0f of them in the consumer, and %.0f µs after, %.0f in the consumer. "+
			"%.1f× the baseline's events/s is %.0f/s, which allows at most %.0f µs per event in all on %d cores; "+
			"Postgres, Kafka, the harness and the simulator alone spent %.0f µs per event in this run",
			ms(base.Latency), base.CPU.Idle, x.CPU.Idle, r.env.CPUs, perEvent(base.CPU.bench(), base.TP.Rate), perEvent(base.CPU.Consumer, base.TP.Rate),
			perEvent(x.CPU.bench(), x.TP.Rate), perEvent(x.CPU.Consumer, x.TP.Rate), rateRatioTarget, want, budget, r.env.CPUs, others)
		if left := budget - others; left > 0 {
			p(", which leaves the consumer %.0f µs.\n", left)
		} else {
			p(": more than the whole budget, so no consumer could meet it on this machine.\n")
		}
	}
}

// comparisonSummary is the README's before/after table (with -baseline),
// else its line on the previous run (with -json), else nothing.
func (r report) comparisonSummary() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	if len(r.baseline) > 0 {
		p("\nBefore (%s) and after, default mode, in the same sitting:\n\n", r.env.BaselineConsumer)
		p("| provider latency | events/s before → after | CPU µs/event before → after | allocs/event before → after |\n|---:|---:|---:|---:|\n")
		for _, base := range r.baseline {
			if x, ok := r.find("default", base.Latency); ok {
				p("| %s | %.0f → %.0f (%.2f×) | %.0f → %.0f | %.0f → %.0f |\n", ms(base.Latency), base.TP.Rate, x.TP.Rate, ratio(x.TP.Rate, base.TP.Rate),
					base.Cost.CPUPerEvent(), x.Cost.CPUPerEvent(), base.Cost.AllocsPerEvent(), x.Cost.AllocsPerEvent())
			}
		}
		return b.String()
	}
	if prev := r.previous; prev != nil {
		var parts []string
		for _, x := range r.results {
			if old, ok := prev.find(x.Mode, x.Latency); ok && x.Mode == "default" {
				parts = append(parts, fmt.Sprintf("%.0f → %.0f events/s at %s", old.EventsPerS, x.TP.Rate, ms(x.Latency)))
			}
		}
		if len(parts) > 0 {
			p("\nAgainst the previous run (%s, %s), default mode: %s.\n", prev.Consumer, prev.Date.Format("2006-01-02"), strings.Join(parts, ", "))
		}
	}
	return b.String()
}
