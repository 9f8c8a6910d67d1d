package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// The README's performance summary lies between these markers; -readme
// rewrites what is between them, so that its figures are the run's own.
const (
	readmeBegin = "<!-- billing-bench:begin (written by make bench from the run of docs/benchmarks.md; do not edit) -->"
	readmeEnd   = "<!-- billing-bench:end -->"
)

// speedupLatency is the provider latency of the speedup target.
const speedupLatency = 20 * time.Millisecond

// readmeSummary is the README's short form of the report: the results
// table and the pgbench figures, all from this run.
func (r report) readmeSummary() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("`make bench` on %s (%d CPUs shared by Kafka, Postgres with fsync on, the simulator, the harness and the consumer), "+
		"on %s; full report and chart in [docs/benchmarks.md](docs/benchmarks.md):\n\n", r.env.CPUModel, r.env.CPUs, r.env.Consumer)
	p("| mode | provider latency | events/s | CPU µs/event | allocs/event | p50 / p99 produce→commit | peak RSS |\n|---|---:|---:|---:|---:|---:|---:|\n")
	speedup, hasSpeedup := r.speedup()
	for _, x := range r.results {
		rate := fmt.Sprintf("%.0f", x.TP.Rate)
		if x.Mode == "default" {
			rate = "**" + rate + "**"
			if hasSpeedup && x.Latency == speedupLatency {
				rate += fmt.Sprintf(" (%.0f× sequential)", speedup)
			}
		}
		p("| %s | %s | %s | %.0f | %.0f | %s / %s | %s |\n", x.Mode, ms(x.Latency), rate, x.Cost.CPUPerEvent(), x.Cost.AllocsPerEvent(),
			ms(x.P50), ms(x.P99), mb(x.PeakRSS))
	}
	b.WriteString(r.comparisonSummary())
	b.WriteString(r.sweepSummary())
	b.WriteString(r.recoverySummary())
	b.WriteString(r.failingSummary())
	if len(r.pgbench) > 0 {
		var parts []string
		for _, x := range r.pgbench {
			clients := fmt.Sprintf("%d clients", x.Clients)
			if x.Clients == 1 {
				clients = "one client"
			}
			parts = append(parts, fmt.Sprintf("%.0f tx/s with %s", x.TPS, clients))
		}
		p("\nPostgres alone runs the same per-event transaction (pgbench, no payment call) at %s.\n", strings.Join(parts, " and "))
	}
	return b.String()
}

// writeReadme replaces the text between the markers of the file at path
// with summary. A file without both markers, in order, is an error:
// nothing is written.
func writeReadme(path, summary string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, readmeBegin), strings.Index(s, readmeEnd)
	if i < 0 || j < i {
		return errors.New(path + ": no " + readmeBegin + " ... " + readmeEnd + " section to rewrite")
	}
	out := s[:i+len(readmeBegin)] + "\n" + summary + s[j:]
	return os.WriteFile(path, []byte(out), 0o644)
}
