package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
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
	o    options
	pool *pgxpool.Pool
	// baseURL and basePool are the baseline binary's own database
	// (baselinedb.go); empty without -baseline.
	baseURL    string
	basePool   *pgxpool.Pool
	log        io.Writer
	out        io.Writer
	firstOrder int64 // next free order id; fresh per invocation (from the clock)
	svc        services
	prof       *profiler    // nil unless -profile
	tlsProv    *tlsProvider // made by the first tls mode (tlsprovider.go)
	// topicPartitions, when set, is the partition count of the topics
	// newPhase creates instead of partitions (the partition sweep).
	topicPartitions int
}

// bin is the binary of result r: the one under test, or the -baseline one.
func (b *bench) bin(r *result) string {
	if r.Baseline {
		return b.o.baseline
	}
	return b.o.bin
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
	db           *pgxpool.Pool // the database the phase's binary bills into
	fail         *failing      // the orders failing at sim; nil unless the mode's failing
}

// newPhase creates the phase's topic and starts its simulator; the phase
// gets a fresh range of at least records order ids.
func (b *bench) newPhase(ctx context.Context, m mode, latency time.Duration, kind string, records int, baseline bool) (*phase, error) {
	name := kafkatest.UniqueName(fmt.Sprintf("bench-%s-%dms-%s", m.name, latency.Milliseconds(), kind))
	if err := kafkatest.CreateTopicErr(ctx, b.o.brokers, name, cmp.Or(b.topicPartitions, partitions)); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", name, err)
	}
	dbURL, db := b.o.dbURL, b.pool
	if baseline {
		dbURL, db = b.baseURL, b.basePool
	}
	// The earlier phases' ledger rows, vacuumed now rather than by an
	// autovacuum in the middle of this phase's measured window (on a long
	// run it took a quarter of a core during the partition sweep).
	if _, err := db.Exec(ctx, "VACUUM (ANALYZE)", pgx.QueryExecModeSimpleProtocol); err != nil {
		return nil, fmt.Errorf("vacuum before phase %s: %w", name, err)
	}
	p := &phase{topic: name, group: name, firstOrder: b.firstOrder, orders: int64(max(ordersPerPhase, records)), db: db}
	b.firstOrder += p.orders
	p.sim = paysim.New(paysim.Config{Seed: uint64(p.firstOrder), Faults: paysim.Faults{Latency: latency}})
	if m.failing {
		p.fail = newFailing(p, latency)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.srv = &http.Server{Handler: p.sim, ReadHeaderTimeout: 5 * time.Second}
	scheme, provider := "http", []string(nil)
	if m.tls {
		t, err := b.providerTLS()
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		scheme, provider, p.srv.TLSConfig = "https", []string{"BILLING_PAYMENT_CA_FILE=" + t.caFile}, t.serverConfig()
		go p.srv.ServeTLS(ln, "", "") //nolint:errcheck // ends with Close
	} else {
		go p.srv.Serve(ln) //nolint:errcheck // ends with Close
	}
	p.env = append([]string{
		"BILLING_KAFKA_BROKERS=" + strings.Join(b.o.brokers, ","),
		"BILLING_KAFKA_TOPIC=" + p.topic,
		"BILLING_KAFKA_GROUP_ID=" + p.group,
		"BILLING_KAFKA_DLQ_TOPIC=" + dlqTopic,
		"BILLING_DATABASE_URL=" + dbURL,
		"BILLING_PAYMENT_URL=" + scheme + "://" + ln.Addr().String(),
		"BILLING_KAFKA_LAG_INTERVAL=1s",
	}, slices.Concat(provider, phaseEnv(m, baseline), b.prof.env())...)
	return p, nil
}

// endPhase stops p's simulator and deletes its topic: the topics of a
// whole run left on the one broker (thousands of partitions by the
// partition sweep) cost it CPU in every later phase. A topic that cannot
// be deleted is only logged.
func (b *bench) endPhase(p *phase) {
	_ = p.srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(b.o.brokers...), Timeout: 10 * time.Second}
	res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{p.topic}})
	if err == nil {
		err = res.Errors[p.topic]
	}
	if err != nil {
		fmt.Fprintf(b.log, "billing-bench: delete topic %s: %v\n", p.topic, err)
	}
}

// measure runs the backlog phase, then the steady phase at half the
// measured rate, of mode m at provider latency latency.
func (b *bench) measure(ctx context.Context, m mode, latency time.Duration, baseline bool) (result, error) {
	r := result{Mode: m.name, Latency: latency, Baseline: baseline, Backlog: backlog(m, latency, b.o.scale)}
	fmt.Fprintf(b.out, "%s%s, provider latency %v: %d records backlog...\n", m.name, r.binLabel(), latency, r.Backlog)
	r, err := b.drains(ctx, m, r)
	if err != nil {
		return r, err
	}
	if r.TP.Rate <= 0 {
		return r, fmt.Errorf("no committed-offset advance to measure (committed %d)", r.TP.Committed)
	}
	r.SteadyRate = min(b.o.steadyCap, r.TP.Rate/2)
	r.SteadyRecords = max(10, int(r.SteadyRate*b.o.steadyFor.Seconds()))
	fmt.Fprintf(b.out, "  steady load: %d records at %.0f/s...\n", r.SteadyRecords, r.SteadyRate)
	err = b.steadyPhase(ctx, m, latency, &r)
	return r, err
}

// drains runs the backlog phase of r (its mode, latency and backlog)
// -repeat times in the default mode, once in the sequential one, and
// returns the run with the median events/s, its Spread holding every
// run's. The runs of one machine differ by about ±10% in events/s and CPU
// per event (scheduling, GC and checkpoint timing); the median of
// several is what a comparison between two binaries can rely on. Every
// run is checked for exactly-once: a failure of any of them is in the
// returned run's problems.
func (b *bench) drains(ctx context.Context, m mode, r result) (result, error) {
	n := b.o.repeat
	if m.sequential {
		n = 1
	}
	runs := make([]result, 0, n)
	for i := range n {
		x := r
		if err := b.backlogPhase(ctx, m, r.Latency, &x); err != nil {
			return x, err
		}
		if n > 1 {
			fmt.Fprintf(b.out, "  drain %d of %d: %.0f events/s, %.0f µs CPU per event\n", i+1, n, x.TP.Rate, x.Cost.CPUPerEvent())
		}
		runs = append(runs, x)
	}
	return medianRun(runs), nil
}

// backlogPhase produces the backlog, starts the consumer, and measures
// events/s, CPU, allocations and peak RSS until the backlog is drained
// (default mode) or the time box ends (sequential mode).
func (b *bench) backlogPhase(ctx context.Context, m mode, latency time.Duration, r *result) error {
	p, err := b.newPhase(ctx, m, latency, "backlog", r.Backlog, r.Baseline)
	if err != nil {
		return err
	}
	defer b.endPhase(p)
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
	if err := p.fail.settle(ctx, p, r.Backlog, r); err != nil {
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
	if !m.sequential {
		r.TP.Rate = r.Cost.Rate() // the steady middle of the drain, not the commit ticks (watchBacklog)
	}
	r.PeakRSS = max(r.PeakRSS, rss)
	if r.Cost.Events <= 0 {
		r.notes = append(r.notes, "no event finished in the measured window: no events/s, CPU or allocations per event (backlog too small)")
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

// The default mode's measured window is the middle of its drain: it opens
// when the consumer has finished steadyFrom of the backlog and closes at
// steadyTo, both read from its own billing_events_total, scraped every
// scrapeEvery. About as many events are in flight at both ends (fetched,
// decoded, claimed, at the provider), so the work done before the window
// on the events finished in it is balanced by the work done in it on the
// events finished after; and the start (join, first fetches) and the tail
// (the last, partly filled batches) stay out. A window that closed on the
// drained backlog instead would have nothing in flight at its close: the
// smaller the backlog, the larger the share of its events whose decoding
// and claiming fell before it, and the cheaper they would look.
const (
	steadyFrom, steadyTo = 0.2, 0.8
	scrapeEvery          = 50 * time.Millisecond
)

// watchBacklog waits until the backlog is drained (default mode) or the
// time box after the first commit ends (sequential mode), sampling the
// simulator's charges in progress in the measured window. At the window's
// two ends it reads the consumer's counters and the CPU of every process,
// so that the CPU and allocations are those of the events finished in
// between. The sequential mode's window runs from the first
// committed-offset advance to the end of the time box: one event is in
// flight at a time, so its ends need no balancing.
func (b *bench) watchBacklog(ctx context.Context, m mode, p *phase, proc *consumerProc, poll *poller, r *result) (backlogWatch, error) {
	var w backlogWatch
	var first, lastScrape time.Time
	var opened, closed, scraped bool
	var inFlight, inFlightN int
	deadline := time.Now().Add(3 * time.Minute)
	open := func(c counters) {
		w.c0, w.cpu0, opened = c, takeCPU(proc.Pid(), b.svc), true
	}
	shut := func(c counters) {
		w.c1, w.cpu1, closed = c, takeCPU(proc.Pid(), b.svc), true
	}
	for {
		if err := proc.exited(); err != nil {
			return w, err
		}
		last := poll.last()
		if last.total() > 0 && first.IsZero() {
			first = last.at
			b.prof.start(ctx, proc)
			if m.sequential {
				w.until = first.Add(b.o.timebox)
				c, err := readCounters(ctx, proc, last.total())
				if err != nil {
					return w, err
				}
				open(c)
			}
		}
		drained := last.total() == int64(r.Backlog)
		if !m.sequential && !closed && (drained || time.Since(lastScrape) >= scrapeEvery) {
			lastScrape = time.Now()
			c, err := readCounters(ctx, proc, last.total())
			switch {
			case err != nil && !scraped && first.IsZero():
				// The consumer's listener may not be up yet.
			case err != nil:
				return w, err
			default:
				scraped = true
				if !opened && (c.finished >= steadyFrom*float64(r.Backlog) || drained) {
					open(c)
				} else if opened && (c.finished >= steadyTo*float64(r.Backlog) || drained) {
					shut(c)
				}
			}
		}
		if drained {
			break
		}
		if opened && !closed {
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
	if !closed {
		c, err := readCounters(ctx, proc, poll.last().total())
		if err != nil {
			return w, err
		}
		if !opened {
			open(c)
		}
		shut(c)
	}
	if inFlightN > 0 {
		r.InFlight = float64(inFlight) / float64(inFlightN)
	}
	return w, b.prof.finish(ctx)
}
