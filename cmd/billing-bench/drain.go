package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// The measured window of a drain is its middle: it opens when the consumer
// has finished steadyFrom of the backlog and closes at steadyTo, both read
// from its billing_events_total, scraped every scrapeEvery. About as many
// events are in flight at both ends (fetched, decoded, claimed, at the
// provider), so the work done before the window on the events finished in
// it balances the work done in it on the events finished after; the start
// (join, first fetches) and the tail (the last, partly filled batches)
// stay out.
const (
	steadyFrom, steadyTo = 0.2, 0.8
	scrapeEvery          = 250 * time.Millisecond
	// drainBacklog is the backlog of the drains (times -scale): about
	// thirty seconds of work here.
	drainBacklog = 160_000
	// drainMax bounds one drain.
	drainMax = 5 * time.Minute
)

// producer writes a backlog's records to a topic.
type producer func(ctx context.Context, brokers []string, topic string, recs []kafka.Message) error

// drainSpec is what one drain runs.
type drainSpec struct {
	bin        *binary
	partitions int
	backlog    int
	env        []string // on top of the phase's
	produce    producer
	batching   string    // names produce in the sweep's table
	prof       *profiler // nil except under -profile
}

// drain is what one drain of a backlog measured: the per-event figures
// over the measured window, the peaks over the whole drain.
type drain struct {
	Binary         string  `json:"binary"`
	Partitions     int     `json:"partitions"`
	Batching       string  `json:"producer_batching,omitempty"`
	Backlog        int     `json:"backlog"`
	Events         int64   `json:"events_in_window"`
	WindowS        float64 `json:"window_s"`
	EventsPerS     float64 `json:"events_per_s"`
	CPU            float64 `json:"consumer_cpu_us_per_event"`
	PGCPU          float64 `json:"postgres_cpu_us_per_event"`
	WAL            float64 `json:"wal_bytes_per_event"`
	Allocs         float64 `json:"allocs_per_event"`
	AllocBytes     float64 `json:"alloc_bytes_per_event"`
	PerTx          float64 `json:"events_per_transaction"`
	PeakRSS        int64   `json:"peak_rss_bytes"`
	PeakHeap       int64   `json:"peak_heap_inuse_bytes"`
	PeakGoroutines int     `json:"peak_goroutines"`
	PeakFDs        int     `json:"peak_open_fds"`
	// CPURatio is the sweep's: the consumer CPU per event against the
	// fewest partitions', the median of each round's paired ratios.
	CPURatio float64  `json:"cpu_vs_fewest_partitions,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// defaultDrain is the drain of the table: the binary's defaults, 0 ms at
// the provider, kafka-go's writer in batches of 500.
func (b *bench) defaultDrain(bin *binary) drainSpec {
	return drainSpec{bin: bin, partitions: drainPartitions, backlog: max(1000, int(drainBacklog*b.o.scale)), produce: harness.Produce}
}

// drain produces s.backlog records to a fresh topic, starts the consumer,
// measures it until it has finished them all, stops it and checks that
// every order was charged exactly once.
func (b *bench) drain(ctx context.Context, s drainSpec) (drain, error) {
	d := drain{Binary: s.bin.Label, Partitions: s.partitions, Batching: s.batching, Backlog: s.backlog}
	fmt.Fprintf(b.out, "drain (%s): %d records, %d partitions %s... ", s.bin.Label, s.backlog, s.partitions, s.batching)
	p, err := b.newPhase(ctx, s.bin, "drain", s.partitions, s.backlog, s.env)
	if err != nil {
		return d, err
	}
	defer b.end(p)
	plan, err := p.plan()
	if err != nil {
		return d, err
	}
	if err := s.produce(ctx, b.o.brokers, p.topic, plan.Records); err != nil {
		return d, err
	}
	proc, err := b.start(p)
	if err != nil {
		return d, err
	}
	defer proc.Stop(5 * time.Second)
	if err := b.watch(ctx, proc, s, &d); err != nil {
		return d, err
	}
	if d.PeakRSS, err = peakRSS(proc.Pid()); err != nil {
		return d, err
	}
	if err := proc.Stop(45 * time.Second); err != nil {
		return d, fmt.Errorf("billing-consumer did not stop cleanly: %w", err)
	}
	d.Problems, err = b.verify(ctx, p, plan)
	fmt.Fprintf(b.out, "%.0f events/s, %.0f µs CPU/event (Postgres %.0f), %.0f allocs/event, %.1f events/transaction, peak RSS %s, heap %s\n",
		d.EventsPerS, d.CPU, d.PGCPU, d.Allocs, d.PerTx, mb(d.PeakRSS), mb(d.PeakHeap))
	return d, err
}

// reading is the consumer's counters at one moment, from one scrape, with
// Postgres's CPU and WAL position read just after it at the window's ends.
type reading struct {
	at                                    time.Time
	finished, cpu, mallocs, allocs, pgCPU float64
	batched, batches                      float64 // billing_batch_size's sum and count
	wal                                   int64
}

// watch scrapes the consumer every scrapeEvery until it has finished
// s.backlog events, keeping its peaks in d and, from the readings at the
// window's ends, its figures per event.
func (b *bench) watch(ctx context.Context, proc *consumerProc, s drainSpec, d *drain) error {
	var w0, w1 *reading
	deadline := time.Now().Add(drainMax)
	for {
		if exited, err := proc.Exited(); exited {
			return fmt.Errorf("billing-consumer exited early: %v", err)
		}
		if f, err := harness.Scrape(ctx, proc.addr); err == nil { // before its listener is up: err
			if f["go_memstats_mallocs_total"] == nil || f["process_cpu_seconds_total"] == nil {
				return fmt.Errorf("the consumer's /metrics lacks the Go and process collectors")
			}
			r := reading{at: time.Now(), finished: sum(f, "billing_events_total"), cpu: sum(f, "process_cpu_seconds_total"),
				mallocs: sum(f, "go_memstats_mallocs_total"), allocs: sum(f, "go_memstats_alloc_bytes_total")}
			if h := f["billing_batch_size"].GetMetric(); len(h) == 1 {
				r.batched, r.batches = h[0].GetHistogram().GetSampleSum(), float64(h[0].GetHistogram().GetSampleCount())
			}
			d.PeakHeap = max(d.PeakHeap, int64(sum(f, "go_memstats_heap_inuse_bytes")))
			d.PeakGoroutines = max(d.PeakGoroutines, int(sum(f, "go_goroutines")))
			d.PeakFDs = max(d.PeakFDs, int(sum(f, "process_open_fds")))
			if r.finished > 0 {
				s.prof.start(ctx)
			}
			switch {
			case w0 == nil && r.finished >= steadyFrom*float64(s.backlog):
				w0, err = &r, b.readPostgres(ctx, &r)
			case w0 != nil && w1 == nil && r.finished >= steadyTo*float64(s.backlog):
				w1, err = &r, b.readPostgres(ctx, &r)
			}
			if err != nil {
				return err
			}
			if r.finished >= float64(s.backlog) {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("backlog of %d records not drained within %v", s.backlog, drainMax)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(scrapeEvery):
		}
	}
	if w1 == nil {
		return fmt.Errorf("the drain finished before its measured window closed: backlog too small")
	}
	d.perEvent(*w0, *w1)
	return s.prof.finish(ctx)
}

// readPostgres adds Postgres's CPU and WAL position to r. The WAL is the
// cluster's: the baseline's database writes to the same one.
func (b *bench) readPostgres(ctx context.Context, r *reading) error {
	r.pgCPU = pgCPU(b.postmaster)
	if err := b.admin.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&r.wal); err != nil {
		return fmt.Errorf("read the WAL position: %w", err)
	}
	return nil
}

// perEvent sets d's figures per event from the readings at the window's
// two ends; all are 0 when no event finished in between.
func (d *drain) perEvent(a, z reading) {
	d.Events, d.WindowS = int64(z.finished-a.finished), z.at.Sub(a.at).Seconds()
	if d.Events <= 0 || d.WindowS <= 0 {
		return
	}
	n := float64(d.Events)
	d.EventsPerS = n / d.WindowS
	d.CPU, d.PGCPU = (z.cpu-a.cpu)*1e6/n, (z.pgCPU-a.pgCPU)*1e6/n
	d.WAL = float64(z.wal-a.wal) / n
	d.Allocs, d.AllocBytes = (z.mallocs-a.mallocs)/n, (z.allocs-a.allocs)/n
	if z.batches > a.batches {
		d.PerTx = (z.batched - a.batched) / (z.batches - a.batches)
	}
}

// sum is the total of every series of family name (counters and gauges);
// 0 when the family is missing.
func sum(f map[string]*dto.MetricFamily, name string) float64 {
	var total float64
	for _, m := range f[name].GetMetric() {
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

// median is the median of xs (the mean of the middle two of an even
// count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Sorted(slices.Values(xs))
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// summarize is the drain with the median events/s of runs (the upper one
// of an even count) with the largest peaks of all and every problem.
func summarize(runs []drain) drain {
	sorted := slices.SortedFunc(slices.Values(runs), func(a, b drain) int { return cmp.Compare(a.EventsPerS, b.EventsPerS) })
	med := sorted[len(sorted)/2]
	med.Problems = nil
	for _, r := range runs {
		med.PeakRSS, med.PeakHeap = max(med.PeakRSS, r.PeakRSS), max(med.PeakHeap, r.PeakHeap)
		med.PeakGoroutines, med.PeakFDs = max(med.PeakGoroutines, r.PeakGoroutines), max(med.PeakFDs, r.PeakFDs)
		med.Problems = append(med.Problems, r.Problems...)
	}
	return med
}

// runDrains drains the default backlog -repeat times with the binary under
// test. With -baseline it drains it as often with each binary, in pairs
// run back to back, alternating which goes first (AB, BA, AB, ...) so that
// a drift of the machine over the sitting weighs on both alike: drains of
// one sitting differ by ±10% and more on a shared machine, and what
// compares the binaries is the median of the paired ratios (medianRatio).
func (b *bench) runDrains(ctx context.Context) ([]drain, error) {
	bins := []*binary{b.under}
	if b.base != nil {
		bins = append(bins, b.base)
	}
	var out []drain
	for i := range b.o.repeat {
		for j := range bins {
			bin := bins[(i+j)%len(bins)]
			d, err := b.drain(ctx, b.defaultDrain(bin))
			if err != nil {
				return out, fmt.Errorf("drain %d, %s: %w", i+1, bin.Label, err)
			}
			out = append(out, d)
		}
	}
	return out, nil
}

// metric is one figure of a drain, as the tables compare it.
type metric struct {
	name string
	of   func(drain) float64
}

// compared are the figures of a drain that the tables compare, in the
// order of their columns.
var compared = []metric{
	{"events/s", func(d drain) float64 { return d.EventsPerS }},
	{"consumer CPU µs/event", func(d drain) float64 { return d.CPU }},
	{"Postgres CPU µs/event", func(d drain) float64 { return d.PGCPU }},
	{"WAL bytes/event", func(d drain) float64 { return d.WAL }},
	{"allocs/event", func(d drain) float64 { return d.Allocs }},
	{"events/transaction", func(d drain) float64 { return d.PerTx }},
}

// medianRatio is, over the pairs of drains (runDrains with -baseline),
// the median of m's ratio under test / baseline; 0 without a pair.
func medianRatio(drains []drain, m metric) float64 {
	var rs []float64
	for i := 0; i+1 < len(drains); i += 2 {
		after, before := drains[i], drains[i+1]
		if after.Binary == "baseline" {
			after, before = before, after
		}
		if after.Binary != before.Binary && m.of(before) != 0 {
			rs = append(rs, m.of(after)/m.of(before))
		}
	}
	return median(rs)
}
