package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/harness"
	"github.com/billing-consumer/billing-consumer/internal/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/paysim"
)

const (
	partitions = 6
	dlqTopic   = "billing-bench.dlq"
	// ordersPerPhase is the least spacing of the order-id ranges of the
	// phases; a phase of more records gets a range as large as it.
	ordersPerPhase = 100_000
)

// bench holds what the runs share.
type bench struct {
	o          options
	pool       *pgxpool.Pool
	log        io.Writer
	out        io.Writer
	firstOrder int64 // next free order id; fresh per invocation (from the clock)
	svc        services
	prof       *profiler // nil unless -profile
}

// bin is the binary of result r: the one under test, or the -baseline one.
func (b *bench) bin(r *result) string {
	if r.Baseline {
		return b.o.baseline
	}
	return b.o.bin
}

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
	PeakRSS        int64 // bytes, the larger of the two processes' VmHWM
	Charges        int   // orders verified charged exactly once, both phases
	problems       []string
	notes          []string
}

// binLabel is " (baseline)" for a run of the -baseline binary, else "".
func (r result) binLabel() string {
	if r.Baseline {
		return " (baseline)"
	}
	return ""
}

func (r result) line() string {
	s := fmt.Sprintf("  %-10s %5v%s: %7.0f events/s (%d committed in %.1fs), %.0f µs CPU, %.0f allocs, %.1f KiB per event; ",
		r.Mode, r.Latency, r.binLabel(), r.TP.Rate, r.TP.Committed, r.TP.Window.Seconds(),
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

// phase is one consumer process on one fresh topic with its own group,
// order range and simulator.
type phase struct {
	topic, group string
	firstOrder   int64
	orders       int64 // the phase's orders are firstOrder .. firstOrder+orders-1
	sim          *paysim.Sim
	srv          *http.Server
	env          []string
}

// newPhase creates the phase's topic and starts its simulator; the phase
// gets a fresh range of at least records order ids.
func (b *bench) newPhase(ctx context.Context, m mode, latency time.Duration, kind string, records int) (*phase, error) {
	name := kafkatest.UniqueName(fmt.Sprintf("bench-%s-%dms-%s", m.name, latency.Milliseconds(), kind))
	if err := kafkatest.CreateTopicErr(ctx, b.o.brokers, name, partitions); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", name, err)
	}
	p := &phase{topic: name, group: name, firstOrder: b.firstOrder, orders: int64(max(ordersPerPhase, records))}
	b.firstOrder += p.orders
	p.sim = paysim.New(paysim.Config{Seed: uint64(p.firstOrder), Faults: paysim.Faults{Latency: latency}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.srv = &http.Server{Handler: p.sim, ReadHeaderTimeout: 5 * time.Second}
	go p.srv.Serve(ln) //nolint:errcheck // ends with Close
	p.env = append([]string{
		"BILLING_KAFKA_BROKERS=" + strings.Join(b.o.brokers, ","),
		"BILLING_KAFKA_TOPIC=" + p.topic,
		"BILLING_KAFKA_GROUP_ID=" + p.group,
		"BILLING_KAFKA_DLQ_TOPIC=" + dlqTopic,
		"BILLING_DATABASE_URL=" + b.o.dbURL,
		"BILLING_PAYMENT_URL=http://" + ln.Addr().String(),
		"BILLING_KAFKA_LAG_INTERVAL=1s",
	}, append(m.env, b.prof.env()...)...)
	return p, nil
}

// measure runs the backlog phase, then the steady phase at half the
// measured rate, of mode m at provider latency latency.
func (b *bench) measure(ctx context.Context, m mode, latency time.Duration, baseline bool) (result, error) {
	r := result{Mode: m.name, Latency: latency, Baseline: baseline, Backlog: backlog(m, latency, b.o.scale)}
	fmt.Fprintf(b.out, "%s%s, provider latency %v: %d records backlog...\n", m.name, r.binLabel(), latency, r.Backlog)
	if err := b.backlogPhase(ctx, m, latency, &r); err != nil {
		return r, err
	}
	if r.TP.Rate <= 0 {
		return r, fmt.Errorf("no committed-offset advance to measure (committed %d)", r.TP.Committed)
	}
	r.SteadyRate = min(b.o.steadyCap, r.TP.Rate/2)
	r.SteadyRecords = max(10, int(r.SteadyRate*b.o.steadyFor.Seconds()))
	fmt.Fprintf(b.out, "  steady load: %d records at %.0f/s...\n", r.SteadyRecords, r.SteadyRate)
	err := b.steadyPhase(ctx, m, latency, &r)
	return r, err
}

// backlogPhase produces the backlog, starts the consumer, and measures
// events/s, CPU, allocations and peak RSS until the backlog is drained
// (default mode) or the time box ends (sequential mode).
func (b *bench) backlogPhase(ctx context.Context, m mode, latency time.Duration, r *result) error {
	p, err := b.newPhase(ctx, m, latency, "backlog", r.Backlog)
	if err != nil {
		return err
	}
	defer p.srv.Close()
	recs, err := workload(p.firstOrder, r.Backlog)
	if err != nil {
		return err
	}
	if err := harness.Produce(ctx, b.o.brokers, p.topic, recs); err != nil {
		return err
	}
	poll := startPoller(ctx, b.o.brokers, p.topic, p.group, partitions, b.o.poll)
	defer poll.finish()
	proc, err := startConsumer(b.bin(r), p.env, b.log)
	if err != nil {
		return err
	}
	defer proc.Stop(5 * time.Second)
	w, err := b.watchBacklog(ctx, m, p, proc, poll, r)
	if err != nil {
		return err
	}
	rss, err := peakRSS(proc.Pid())
	if err != nil {
		return err
	}
	if r.Stats, err = scrape(ctx, proc.httpAddr); err != nil {
		return err
	}
	if r.Stats.Retries > 0 {
		r.notes = append(r.notes, fmt.Sprintf("the consumer retried %.0f times (billing_retries_total)", r.Stats.Retries))
	}
	if err := proc.Stop(45 * time.Second); err != nil {
		return fmt.Errorf("billing-consumer did not stop cleanly: %w", err)
	}
	r.TP = measureThroughput(poll.finish(), w.until)
	r.CPU = since(w.cpu0, w.cpu1)
	r.Cost = costBetween(w.c0, w.c1)
	r.PeakRSS = max(r.PeakRSS, rss)
	if r.Cost.Events <= 0 {
		r.notes = append(r.notes, "no event committed after the first advance: no CPU or allocations per event (backlog too small)")
	}
	return b.verify(ctx, p, r, !m.sequential)
}

// backlogWatch is what watchBacklog read at the two ends of the measured
// window.
type backlogWatch struct {
	until      time.Time // end of a sequential run's time box; zero for the default mode
	cpu0, cpu1 cpuSnapshot
	c0, c1     counters
}

// watchBacklog waits until the backlog is drained (default mode) or the
// time box after the first commit ends (sequential mode), sampling the
// simulator's charges in progress. The consumer's counters and the CPU of
// every process are read when the first committed-offset advance is seen
// and again at the end, so that the CPU and allocations are those of the
// events committed in between.
func (b *bench) watchBacklog(ctx context.Context, m mode, p *phase, proc *consumerProc, poll *poller, r *result) (backlogWatch, error) {
	var w backlogWatch
	var first time.Time
	var inFlight, inFlightN int
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if err := proc.exited(); err != nil {
			return w, err
		}
		last := poll.last()
		if last.total() > 0 && first.IsZero() {
			first = last.at
			if m.sequential {
				w.until = first.Add(b.o.timebox)
			}
			var err error
			if w.c0, err = readCounters(ctx, proc, last.total()); err != nil {
				return w, err
			}
			w.cpu0 = takeCPU(proc.Pid(), b.svc)
			b.prof.start(ctx, proc)
		}
		if last.total() == int64(r.Backlog) {
			break
		}
		if !first.IsZero() {
			inFlight += p.sim.InFlight()
			inFlightN++
		}
		if !w.until.IsZero() && time.Now().After(w.until) {
			break
		}
		if time.Now().After(deadline) {
			r.notes = append(r.notes, fmt.Sprintf("backlog not drained within 3 minutes (%d of %d committed)", last.total(), r.Backlog))
			break
		}
		select {
		case <-ctx.Done():
			return w, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	var err error
	if w.c1, err = readCounters(ctx, proc, poll.last().total()); err != nil {
		return w, err
	}
	w.cpu1 = takeCPU(proc.Pid(), b.svc)
	if inFlightN > 0 {
		r.InFlight = float64(inFlight) / float64(inFlightN)
	}
	return w, b.prof.finish(ctx)
}

// steadyPhase starts a consumer on an empty topic, offers it
// r.SteadyRecords records at r.SteadyRate once it has joined its group,
// and measures the produce-to-commit latency of each.
func (b *bench) steadyPhase(ctx context.Context, m mode, latency time.Duration, r *result) error {
	p, err := b.newPhase(ctx, m, latency, "steady", r.SteadyRecords)
	if err != nil {
		return err
	}
	defer p.srv.Close()
	recs, err := workload(p.firstOrder, r.SteadyRecords)
	if err != nil {
		return err
	}
	proc, err := startConsumer(b.bin(r), p.env, b.log)
	if err != nil {
		return err
	}
	defer proc.Stop(5 * time.Second)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = proc.waitReady(rctx)
	cancel()
	if err != nil {
		return err
	}
	poll := startPoller(ctx, b.o.brokers, p.topic, p.group, partitions, b.o.poll)
	defer poll.finish()
	if err := produceSteady(ctx, b.o.brokers, p.topic, recs, r.SteadyRate); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for poll.last().total() < int64(len(recs)) {
		if err := proc.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			r.notes = append(r.notes, fmt.Sprintf("steady load not committed within a minute of its end (%d of %d)", poll.last().total(), len(recs)))
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	samples := poll.finish()
	rss, err := peakRSS(proc.Pid())
	if err != nil {
		return err
	}
	if err := proc.Stop(45 * time.Second); err != nil {
		return fmt.Errorf("billing-consumer did not stop cleanly: %w", err)
	}
	r.PeakRSS = max(r.PeakRSS, rss)
	back, err := readBack(ctx, b.o.brokers, p.topic)
	if err != nil {
		return err
	}
	lat, missing := commitLatencies(samples, back)
	r.P50, r.P99, r.LatencyMissing = percentile(lat, 0.5), percentile(lat, 0.99), missing
	return b.verify(ctx, p, r, true)
}

// verify checks, after a clean stop, that the orders of exactly the
// committed records were charged, each once, at the provider and in the
// ledger. drain says the topic should have been consumed to its end.
func (b *bench) verify(ctx context.Context, p *phase, r *result, drain bool) error {
	fail := func(format string, args ...any) {
		r.problems = append(r.problems, fmt.Sprintf("%s: ", p.topic)+fmt.Sprintf(format, args...))
	}
	lags, err := harness.Lag(ctx, b.o.brokers, p.topic, p.group)
	if err != nil {
		return err
	}
	committed := map[int]int64{}
	for _, l := range lags {
		committed[l.Partition] = max(l.Committed, 0)
		if drain && l.Committed != l.End {
			r.notes = append(r.notes, fmt.Sprintf("%s: partition %d committed %d of %d", p.topic, l.Partition, l.Committed, l.End))
		}
	}
	recs, err := readBack(ctx, b.o.brokers, p.topic)
	if err != nil {
		return err
	}
	orders := map[int64]bool{}
	for _, rec := range recs {
		if rec.offset < committed[rec.partition] {
			orders[rec.orderID] = true
		}
	}
	if d := p.sim.DoubleCharged(); len(d) > 0 {
		fail("%d orders charged twice, e.g. %v", len(d), d[:min(len(d), 5)])
	}
	if n := p.sim.ChargesTaken(); n != len(orders) {
		fail("the provider took %d charges for %d committed orders", n, len(orders))
	}
	notOnce := 0
	for o := range orders {
		if p.sim.ChargesFor(o) != 1 {
			notOnce++
		}
	}
	if notOnce > 0 {
		fail("%d committed orders not charged exactly once", notOnce)
	}
	var ledger int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM charge WHERE order_id >= $1 AND order_id < $2 AND provider_charge_id IS NOT NULL",
		p.firstOrder, p.firstOrder+p.orders).Scan(&ledger); err != nil {
		return fmt.Errorf("count ledger rows: %w", err)
	}
	if ledger != p.sim.ChargesTaken() {
		fail("%d ledger rows for %d provider charges", ledger, p.sim.ChargesTaken())
	}
	var pending int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM charge WHERE order_id >= $1 AND order_id < $2 AND status <> 'charged'",
		p.firstOrder, p.firstOrder+p.orders).Scan(&pending); err != nil {
		return fmt.Errorf("count unsettled ledger claims: %w", err)
	}
	if pending > 0 {
		fail("%d ledger claims left pending or blocked", pending)
	}
	r.Charges += len(orders) - notOnce
	return nil
}
