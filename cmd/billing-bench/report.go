package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// report is everything a run measured: the JSON as it is, and the source of
// the Markdown tables.
type report struct {
	Machine    machine   `json:"machine"`
	Date       time.Time `json:"date"`
	TookS      float64   `json:"took_s"`
	Scale      float64   `json:"scale"`
	Repeat     int       `json:"repeat"`
	Drains     []drain   `json:"drains,omitempty"` // with -baseline, in pairs (runDrains)
	Partitions []drain   `json:"partitions,omitempty"`
	Recovery   *recovery `json:"recovery,omitempty"`
}

// problems are the failed checks of every run.
func (r *report) problems() []string {
	var out []string
	for _, d := range slices.Concat(r.Drains, r.Partitions) {
		out = append(out, d.Problems...)
	}
	if r.Recovery != nil {
		out = append(out, r.Recovery.Problems...)
	}
	return out
}

// writeJSON writes the report to path.
func (r *report) writeJSON(path string) error {
	r.Date = time.Now().UTC().Truncate(time.Second)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func mb(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/1e6) }

// markdown renders docs/benchmarks.md: the machine and one table per part.
func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := r.Machine
	p("# Benchmarks\n\nWritten by `make bench` (cmd/billing-bench) on %s in %v; do not edit it by hand. "+
		"What each figure is and how it is measured: [performance.md](performance.md).\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"),
		time.Duration(r.TookS)*time.Second)
	p("On %d × %s (shared by Kafka, Postgres, the simulator, the bench and the consumer; load average %s at the start): %s",
		m.CPUs, m.CPUModel, m.LoadAvg, m.Consumer)
	if m.Baseline != "" {
		p(", baseline %s", m.Baseline)
	}
	p("; Postgres %s with `fsync=%s` (scripts/pg.sh); %s, one KRaft node (scripts/kafka.sh).\n", m.Postgres, m.Fsync, m.Kafka)
	if ds := r.Drains; len(ds) > 0 {
		p("\n## Drain\n\nThe binary's defaults, the provider answering at once, a backlog of %d records on %d partitions; "+
			"figures per event over the middle %.0f%% of the drain. Each binary bills into a database of its own, created empty when the bench starts.\n\n", ds[0].Backlog, ds[0].Partitions, 100*(steadyTo-steadyFrom))
		r.drainTable(&b)
	}
	if len(r.Partitions) > 0 {
		r.partitionTable(&b)
	}
	if r.Recovery != nil {
		r.recoveryTable(&b)
	}
	p("\n## Exactly once\n\n")
	if f := r.problems(); len(f) > 0 {
		p("FAILED:\n\n- %s\n", strings.Join(f, "\n- "))
	} else {
		p("After every run, each order was charged exactly once at the simulator with one settled ledger row naming that charge, " +
			"and every record was committed (harness.Verify).\n")
	}
	return b.String()
}

// drainTable writes one row per drain and, with -baseline, the medians of
// the paired ratios; without, the median of each compared column.
func (r *report) drainTable(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("| drain | events/s | consumer CPU µs/event | Postgres CPU µs/event | WAL bytes/event | allocs/event | events/transaction | KiB allocated/event | peak RSS | measured window |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	paired := len(r.Drains) > 1 && r.Drains[0].Binary != r.Drains[1].Binary
	for i, d := range r.Drains {
		label := fmt.Sprint(i + 1)
		if paired {
			label = fmt.Sprintf("pair %d, %s", i/2+1, d.Binary)
		}
		p("| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %s | %d events in %.1f s |\n", label, d.EventsPerS, d.CPU, d.PGCPU,
			d.WAL, d.Allocs, d.PerTx, d.AllocBytes/1024, mb(d.PeakRSS), d.Events, d.WindowS)
	}
	if paired {
		p("| **under test / baseline: median of the %d paired ratios** |", len(r.Drains)/2)
	} else {
		p("| **median** |")
	}
	for _, m := range compared {
		var xs []float64
		for _, d := range r.Drains {
			xs = append(xs, m.of(d))
		}
		if paired {
			p(" **%.2f×** |", medianRatio(r.Drains, m))
		} else {
			p(" **%.0f** |", median(xs))
		}
	}
	p(" | | |\n")
}

// partitionTable writes the partition sweep.
func (r *report) partitionTable(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Cost by partition count\n\nOne replica drains a backlog from a topic of each partition count, with its defaults and the pod's "+
		"`GOMEMLIMIT=%s` (deploy/base), the provider answering at once; each row is the median of %d drains (the ratio: of each round's drain to the fewest partitions' drain beside it), its peaks the largest "+
		"(RSS: VmHWM; heap in use, goroutines and open fds: the consumer's /metrics every %v).\n\n", podGoMemLimit, r.Repeat, scrapeEvery)
	p("| partitions | producer | records | events/s | consumer CPU µs/event | CPU/event vs %d partitions | peak RSS | peak heap in use | peak goroutines | peak open fds |\n", sweepPartitions[0])
	p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, d := range r.Partitions {
		p("| %d | %s | %d | %.0f | **%.0f** | %.2f× | **%s** | **%s** | %d | %d |\n", d.Partitions, d.Batching, d.Backlog, d.EventsPerS, d.CPU, d.CPURatio,
			mb(d.PeakRSS), mb(d.PeakHeap), d.PeakGoroutines, d.PeakFDs)
	}
}

// recoveryTable writes the recovery scenario's stages.
func (r *report) recoveryTable(b *strings.Builder) {
	rec := r.Recovery
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Latency and recovery\n\nTwo replicas with their defaults share one group on a topic of %d partitions under a steady load "+
		"of %.0f orders/s; the provider answers at once. An order's wait runs from its record's send to the provider's receipt of its "+
		"charge; each stage holds the orders sent in it (a stage is its disturbance, then the load alone to %v).\n\n",
		drainPartitions, rec.Rate, time.Duration(rec.StageS)*time.Second)
	p("| stage | orders sent | p50 wait | p99 wait | longest wait |\n|---|---:|---:|---:|---:|\n")
	for _, s := range rec.Stages {
		p("| %s | %d | %.0f ms | %.0f ms | **%.1f s** |\n", s.Name, s.Orders, s.P50MS, s.P99MS, s.MaxMS/1000)
	}
}
