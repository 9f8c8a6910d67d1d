package main

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// sweepBacklogs are the backlog sizes of the sweep: the default mode at
// 0 ms drains each, so that CPU per event can be compared across sizes.
var sweepBacklogs = []int{20_000, 60_000, 200_000}

// flatWithin is the tolerance of the flat-cost target: every point of the
// sweep within this fraction of their mean.
const flatWithin = 0.10

// runSweep drains a backlog of each size of sweepBacklogs (times -scale)
// in the default mode at 0 ms, each a backlog phase of its own with its
// exactly-once check.
func (b *bench) runSweep(ctx context.Context) ([]result, error) {
	def := modes[len(modes)-1]
	var out []result
	for _, n := range sweepBacklogs {
		r := result{Mode: def.name, Latency: 0, Backlog: max(50, int(float64(n)*b.o.scale))}
		fmt.Fprintf(b.out, "sweep: default, 0 ms, %d records backlog...\n", r.Backlog)
		r, err := b.drains(ctx, def, r)
		if err != nil {
			return out, fmt.Errorf("sweep, %d records: %w", r.Backlog, err)
		}
		fmt.Fprintln(b.out, r.line())
		out = append(out, r)
	}
	return out, nil
}

// flatness returns the smallest and largest CPU per event of the sweep
// and their largest deviation from the mean, as a fraction; ok is false
// without two points to compare.
func flatness(sweep []result) (lo, hi, dev float64, ok bool) {
	var sum float64
	n := 0
	for _, x := range sweep {
		if c := x.Cost.CPUPerEvent(); c > 0 {
			if n == 0 || c < lo {
				lo = c
			}
			hi = max(hi, c)
			sum += c
			n++
		}
	}
	if n < 2 {
		return 0, 0, 0, false
	}
	mean := sum / float64(n)
	return lo, hi, max(hi-mean, mean-lo) / mean, true
}

// sweepTargets is issue 14's flat-cost target.
func (r report) sweepTargets() []target {
	lo, hi, dev, ok := flatness(r.sweep)
	if !ok {
		return nil
	}
	return []target{{fmt.Sprintf("CPU per event flat (±%.0f%%) across the %d backlog sizes", flatWithin*100, len(r.sweep)),
		fmt.Sprintf("%.0f–%.0f µs/event (±%.0f%%)", lo, hi, dev*100), dev <= flatWithin, false}}
}

// printSweep writes the sweep to the terminal.
func (r report) printSweep(w io.Writer) {
	for _, x := range r.sweep {
		fmt.Fprintf(w, "sweep: default, 0 ms, %7d records: %7.0f events/s, %5.0f µs CPU/event, %5.0f allocs/event\n",
			x.Backlog, x.TP.Rate, x.Cost.CPUPerEvent(), x.Cost.AllocsPerEvent())
	}
}

// sweepMarkdown writes the sweep's section of docs/benchmarks.md.
func (r report) sweepMarkdown(b *strings.Builder) {
	if len(r.sweep) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n### Cost by backlog size\n\nThe default mode at 0 ms drains backlogs of three sizes, each on a fresh topic with a fresh consumer, " +
		"measured and checked as above; CPU per event should not grow with the work:\n\n")
	p("| backlog | events/s | CPU µs/event | allocs/event | KiB allocated/event | measured window |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.sweep {
		p("| %d records | %.0f%s | **%.0f**%s | %.0f | %.1f | %d events in %.1f s |\n", x.Backlog, x.TP.Rate, x.spread(spreadRate),
			x.Cost.CPUPerEvent(), x.spread(spreadCPU), x.Cost.AllocsPerEvent(),
			x.Cost.BytesPerEvent()/1024, x.Cost.Events, x.Cost.Window.Seconds())
	}
}

// sweepSummary is the README's line on the sweep.
func (r report) sweepSummary() string {
	if len(r.sweep) == 0 {
		return ""
	}
	var parts []string
	for _, x := range r.sweep {
		parts = append(parts, fmt.Sprintf("%s at %dk records", orDash("%.0f µs", x.Cost.CPUPerEvent()), x.Backlog/1000))
	}
	return "\nCPU per event by backlog size (default, 0 ms): " + strings.Join(parts, ", ") + ".\n"
}
