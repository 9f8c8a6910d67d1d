package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// The partition sweep (issue 22): one replica drains the same backlog from
// topics of more and more partitions, in the default mode at 0 ms, with
// the pod's GOMEMLIMIT, so that what one replica costs per owned partition
// shows (a Deployment scaled down hands each survivor all of them).
var sweepPartitionCounts = []int{12, 48, 96, 160}

const (
	// partSweepBacklog is each drain's backlog (times -scale): 500 records
	// a partition at 160.
	partSweepBacklog = 80_000
	// podGoMemLimit is the GOMEMLIMIT of deploy/base/deployment.yaml (its
	// 256Mi limit less 10%); deploy/render_test.go checks that they agree.
	podGoMemLimit = "230MiB"
	// heapEvery is how often a drain samples the consumer's heap.
	heapEvery = 200 * time.Millisecond
	// partsWithin is the tolerance of the flat-in-partitions targets: at
	// the largest count, CPU per event and events/s within this fraction
	// of the smallest count's; partsPeakRSS the peak RSS target.
	partsWithin  = 0.15
	partsPeakRSS = 180e6
)

// partRow is one partition count: the binary under test and, with
// -baseline, the baseline binary, each the median of -repeat drains, with
// the largest Go heap in use sampled during any of them.
type partRow struct {
	Partitions         int
	After, Before      result
	HeapAfter, HeapBef int64
}

// runPartitionSweep runs the partition sweep: at each count the binary
// under test, then the baseline right after it, so that both see the same
// machine.
func (b *bench) runPartitionSweep(ctx context.Context) ([]partRow, error) {
	m := mode{name: "default", env: []string{"GOMEMLIMIT=" + podGoMemLimit}}
	var rows []partRow
	for _, n := range sweepPartitionCounts {
		row := partRow{Partitions: n}
		for _, baseline := range []bool{false, true} {
			if baseline && b.o.baseline == "" {
				continue
			}
			r := result{Mode: m.name, Baseline: baseline, Backlog: max(50, int(float64(partSweepBacklog)*b.o.scale))}
			fmt.Fprintf(b.out, "partitions: %d%s, default, 0 ms, GOMEMLIMIT=%s, %d records backlog...\n", n, r.binLabel(), podGoMemLimit, r.Backlog)
			var runs []result
			var heap int64
			for i := range b.o.repeat {
				x := r
				h, err := b.partitionPhase(ctx, m, n, &x)
				if err != nil {
					return rows, fmt.Errorf("partition sweep, %d partitions%s: %w", n, r.binLabel(), err)
				}
				fmt.Fprintf(b.out, "  drain %d of %d: %.0f events/s, %.0f µs CPU per event, peak RSS %s, heap %s\n",
					i+1, b.o.repeat, x.TP.Rate, x.Cost.CPUPerEvent(), mb(x.PeakRSS), mb(h))
				runs, heap = append(runs, x), max(heap, h)
			}
			if med := medianRun(runs); baseline {
				row.Before, row.HeapBef = med, heap
			} else {
				row.After, row.HeapAfter = med, heap
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// partitionPhase drains r.Backlog records from a fresh topic of parts
// partitions, as backlogPhase does, sampling the consumer's Go heap in use
// (go_memstats_heap_inuse_bytes) every heapEvery; it returns the largest.
func (b *bench) partitionPhase(ctx context.Context, m mode, parts int, r *result) (int64, error) {
	b.topicPartitions = parts
	p, err := b.newPhase(ctx, m, 0, fmt.Sprintf("p%d", parts), r.Backlog, r.Baseline)
	b.topicPartitions = 0
	if err != nil {
		return 0, err
	}
	defer b.endPhase(p)
	recs, err := workload(p.firstOrder, r.Backlog)
	if err != nil {
		return 0, err
	}
	if err := harness.Produce(ctx, b.o.brokers, p.topic, recs); err != nil {
		return 0, err
	}
	poll := startPoller(ctx, b.o.brokers, p.topic, p.group, parts, b.o.poll)
	defer poll.finish()
	proc, err := startConsumer(b.bin(r), p.env, b.log)
	if err != nil {
		return 0, err
	}
	defer proc.Stop(5 * time.Second)
	peakHeap := sampleHeap(ctx, proc.httpAddr)
	w, err := b.watchBacklog(ctx, m, p, proc, poll, r)
	heap := peakHeap()
	if err != nil {
		return heap, err
	}
	rss, err := peakRSS(proc.Pid())
	if err != nil {
		return heap, err
	}
	if r.Stats, err = scrape(ctx, proc.httpAddr); err != nil {
		return heap, err
	}
	if err := proc.Stop(45 * time.Second); err != nil {
		return heap, fmt.Errorf("billing-consumer did not stop cleanly: %w", err)
	}
	r.TP = measureThroughput(poll.finish(), w.until)
	r.CPU = since(w.cpu0, w.cpu1)
	r.Cost = costBetween(w.c0, w.c1)
	r.TP.Rate = r.Cost.Rate() // the steady middle of the drain, as backlogPhase
	r.PeakRSS = max(r.PeakRSS, rss)
	return heap, b.verify(ctx, p, r, true)
}

// sampleHeap scrapes the consumer at addr every heapEvery until the
// returned function is called, which returns the largest heap in use seen.
// A failed scrape (the listener not up yet) is skipped.
func sampleHeap(ctx context.Context, addr string) func() int64 {
	ctx, cancel := context.WithCancel(ctx)
	var peak int64
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(heapEvery)
		defer t.Stop()
		for {
			if f, err := harness.Scrape(ctx, addr); err == nil {
				if h := f["go_memstats_heap_inuse_bytes"]; h != nil && len(h.GetMetric()) == 1 {
					peak = max(peak, int64(h.GetMetric()[0].GetGauge().GetValue()))
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() int64 { cancel(); wg.Wait(); return peak }
}

// partitionTargets are issue 22's: at the largest count, CPU per event and
// events/s within partsWithin of the smallest count's, and peak RSS below
// partsPeakRSS at every count.
func (r report) partitionTargets() []target {
	if len(r.parts) < 2 {
		return nil
	}
	lo, hi := r.parts[0], r.parts[len(r.parts)-1]
	cpu := ratio(hi.After.Cost.CPUPerEvent(), lo.After.Cost.CPUPerEvent())
	rate := ratio(hi.After.TP.Rate, lo.After.TP.Rate)
	var peak int64
	for _, x := range r.parts {
		peak = max(peak, x.After.PeakRSS)
	}
	return []target{
		{fmt.Sprintf("CPU per event at %d partitions within %.0f%% of %d's", hi.Partitions, partsWithin*100, lo.Partitions),
			fmt.Sprintf("%.0f vs %.0f µs/event (%+.0f%%)", hi.After.Cost.CPUPerEvent(), lo.After.Cost.CPUPerEvent(), (cpu-1)*100), cpu > 0 && cpu <= 1+partsWithin, false},
		{fmt.Sprintf("events/s at %d partitions within %.0f%% of %d's", hi.Partitions, partsWithin*100, lo.Partitions),
			fmt.Sprintf("%.0f vs %.0f events/s (%+.0f%%)", hi.After.TP.Rate, lo.After.TP.Rate, (rate-1)*100), rate >= 1-partsWithin, false},
		{fmt.Sprintf("peak RSS < %s at every partition count (GOMEMLIMIT=%s)", mb(partsPeakRSS), podGoMemLimit), mb(peak), peak < partsPeakRSS, false},
	}
}

// printPartitions writes the partition sweep to the terminal.
func (r report) printPartitions(w io.Writer) {
	for _, x := range r.parts {
		fmt.Fprintf(w, "partitions: %3d: %7.0f events/s, %5.0f µs CPU/event, peak RSS %s, heap %s",
			x.Partitions, x.After.TP.Rate, x.After.Cost.CPUPerEvent(), mb(x.After.PeakRSS), mb(x.HeapAfter))
		if x.Before.TP.Rate > 0 {
			fmt.Fprintf(w, "; baseline %7.0f events/s, %5.0f µs, %s, heap %s",
				x.Before.TP.Rate, x.Before.Cost.CPUPerEvent(), mb(x.Before.PeakRSS), mb(x.HeapBef))
		}
		fmt.Fprintln(w)
	}
}

// partitionsMarkdown writes the partition sweep's section of
// docs/benchmarks.md.
func (r report) partitionsMarkdown(b *strings.Builder) {
	if len(r.parts) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n### Cost by partition count\n\nOne replica drains a backlog of %d records from a fresh topic of each partition count, in the default mode at 0 ms, "+
		"with the pod's `GOMEMLIMIT=%s` (deploy/base); the Go heap in use is sampled every %v. ", r.parts[0].After.Backlog, podGoMemLimit, heapEvery)
	before := r.parts[0].Before.TP.Rate > 0
	if before {
		p("The baseline binary drains the same backlog right after each run of the binary under test.")
	}
	p("\n\n| partitions | events/s | CPU µs/event | peak RSS | peak heap in use |")
	if before {
		p(" baseline events/s | baseline CPU µs/event | baseline peak RSS | baseline peak heap |")
	}
	p("\n|---:|---:|---:|---:|---:|")
	if before {
		p("---:|---:|---:|---:|")
	}
	p("\n")
	for _, x := range r.parts {
		p("| %d | %.0f%s | **%.0f**%s | %s | %s |", x.Partitions, x.After.TP.Rate, x.After.spread(spreadRate),
			x.After.Cost.CPUPerEvent(), x.After.spread(spreadCPU), mb(x.After.PeakRSS), mb(x.HeapAfter))
		if before {
			p(" %.0f%s | %.0f%s | %s | %s |", x.Before.TP.Rate, x.Before.spread(spreadRate),
				x.Before.Cost.CPUPerEvent(), x.Before.spread(spreadCPU), mb(x.Before.PeakRSS), mb(x.HeapBef))
		}
		p("\n")
	}
}
