package main

import (
	"fmt"
	"strings"
	"time"
)

// discussion writes what limits each number, from the numbers of this run.
// The claims it makes are arithmetic on the measurements (Little's law, CPU
// seconds per event), so they stay true when the numbers change.
func (r report) discussion(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## What limits each number\n\n")
	p("Everything below runs on the same %d CPUs: the Kafka broker, Postgres, the simulator and this harness compete with the consumer, "+
		"so these are numbers of the whole system on this machine, not of the consumer alone.\n\n", r.env.CPUs)

	r.sequential(p)
	r.littlesLaw(p)
	r.cpuBound(p)
	r.latency(p)
	r.memoryAndNoise(p)
}

// sequential writes the paragraph on the sequential mode: one event at a time, so 1/rate is the time of one event.
func (r report) sequential(p func(format string, args ...any)) {
	var seq []string
	for _, l := range latencies {
		if x, ok := r.find("sequential", l); ok && x.TP.Rate > 0 {
			per := time.Duration(float64(time.Second) / x.TP.Rate)
			if l == 0 {
				seq = append(seq, fmt.Sprintf("%s per event at 0 ms", ms(per)))
			} else {
				seq = append(seq, fmt.Sprintf("%s at %s (%s beyond the provider's latency)", ms(per), ms(l), ms(per-l)))
			}
		}
	}
	if len(seq) > 0 {
		p("- **Sequential mode** handles one event at a time and commits its offset before the next, so events/s is 1 / (time per event): %s. "+
			"Beyond the provider call, each event costs a Postgres transaction of five statements ending in an fsync'd commit", strings.Join(seq, ", "))
		if len(r.pgbench) > 0 {
			p(" (%.2f ms on average in pgbench with one client)", r.pgbench[0].LatencyAvg)
		}
		p(", an HTTP round trip to the simulator and a synchronous offset commit to Kafka.")
		seq0, ok1 := r.find("sequential", 0)
		def0, ok2 := r.find("default", 0)
		if ok1 && ok2 && seq0.TP.Rate > 0 && def0.TP.Rate > 0 {
			p(" The commit per event shows at the broker: %.0f µs of Kafka CPU per event at 0 ms, against %.0f µs in the default mode, which commits once a second.",
				seq0.CPU.Kafka/seq0.TP.Rate*1e6, def0.CPU.Kafka/def0.TP.Rate*1e6)
		}
		p(" At 20 and 100 ms the provider's latency is nearly all of it.\n")
	}
}

// littlesLaw writes the paragraph on the default mode with a provider latency: bounded by its concurrency (Little's law).
func (r report) littlesLaw(p func(format string, args ...any)) {
	for _, l := range latencies[1:] {
		x, ok := r.find("default", l)
		if !ok || x.TP.Rate <= 0 {
			continue
		}
		bound := float64(r.env.Defaults.Concurrency) / l.Seconds()
		slot := time.Duration(float64(r.env.Defaults.Concurrency) / x.TP.Rate * float64(time.Second))
		p("- **Default mode at %s is bounded by its concurrency** (Little's law): each in-flight event holds one of the %d slots for the whole "+
			"provider call (its Postgres transaction and connection are shared with up to %d other events: BILLING_BATCH_SIZE), so events/s ≤ %d / %s = **%.0f/s** whatever the CPU. "+
			"Measured %.0f/s, i.e. %s per event in a slot if all %d are busy. The consumer's own metrics put the provider call at %s on average, "+
			"and the simulator had %.1f charges in progress on average: that many slots were waiting on the provider, the rest of the %d were in "+
			"the batch's Postgres statements and commit",
			ms(l), r.env.Defaults.Concurrency, r.env.Defaults.BatchSize-1, r.env.Defaults.Concurrency, ms(l), bound, x.TP.Rate, ms(slot), r.env.Defaults.Concurrency, ms(x.Stats.PaymentMean),
			x.InFlight, r.env.Defaults.Concurrency)
		if len(r.pgbench) > 1 {
			pg := r.pgbench[len(r.pgbench)-1]
			p(" (pgbench's average transaction takes %.1f ms with %d clients)", pg.LatencyAvg, pg.Clients)
		}
		p(", Kafka and waiting for a CPU (%.2f cores idle).", x.CPU.Idle)
		if t := targetRate[l]; t > bound {
			p(" The target of %.0f/s is above this bound: it cannot be met with BILLING_CONCURRENCY=%d, only with about %.0f or more slots "+
				"(and as many Postgres connections).", t, r.env.Defaults.Concurrency, t*slot.Seconds())
		}
		if seqX, ok := r.find("sequential", l); ok && l == 20*time.Millisecond && seqX.TP.Rate > 0 {
			need := 100 * seqX.TP.Rate
			p(" The 100× speedup target needs %.0f/s here", need)
			if need > bound {
				p(", also above the bound")
			}
			p(".")
		}
		p("\n")
	}
}

// cpuBound writes the paragraph on the default mode at 0 ms: bounded by CPU.
func (r report) cpuBound(p func(format string, args ...any)) {
	cpus := float64(r.env.CPUs)
	if x, ok := r.find("default", 0); ok && x.TP.Rate > 0 {
		c := x.CPU
		perEvent := func(cores float64) float64 { return cores / x.TP.Rate * 1e6 } // µs
		ours := c.bench()
		if c.saturated(r.env.CPUs) {
			p("- **Default mode at 0 ms is bounded by CPU.** ")
		} else {
			p("- **Default mode at 0 ms did not use all the CPU**, so something else limited it. ")
		}
		p("While it drained its backlog the machine had %.2f of %d cores idle; per event the consumer used "+
			"%.0f µs of CPU, Postgres %.0f µs, Kafka %.0f µs and the harness with the simulator %.0f µs: %.0f µs in all, so even with nothing else running "+
			"these %d cores could not do more than about %.0f events/s.",
			c.Idle, r.env.CPUs, perEvent(c.Consumer), perEvent(c.Postgres), perEvent(c.Kafka), perEvent(c.Harness), perEvent(ours), r.env.CPUs, cpus/(ours/x.TP.Rate))
		if t := targetRate[0]; t > cpus/(ours/x.TP.Rate) {
			p(" The %.0f/s target needs at most %.0f µs per event in all on %d cores.", t, cpus/t*1e6, r.env.CPUs)
		}
		if c.Other > 0.1 {
			p(" Other processes of the machine took %.2f cores during that run.", c.Other)
		}
		if len(r.pgbench) > 1 {
			pg := r.pgbench[len(r.pgbench)-1]
			p(" Postgres alone runs the same transaction at %.0f/s with %d clients and both cores to itself (pgbench): the consumer reached %.0f%% of that "+
				"while sharing the CPU with everything else.", pg.TPS, pg.Clients, 100*x.TP.Rate/pg.TPS)
		}
		p("\n")
	}
}

// latency writes the paragraph on the produce→commit latency.
func (r report) latency(p func(format string, args ...any)) {
	var def []string
	for _, x := range r.results {
		if x.Mode == "default" {
			def = append(def, fmt.Sprintf("%s / %s at %s", ms(x.P50), ms(x.P99), ms(x.Latency)))
		}
	}
	if len(def) > 0 {
		p("- **Produce→commit latency** in the default mode is mostly the 1 s commit interval: a finished event waits for its partition's next "+
			"commit, so without queueing p50 is about half a second and p99 about one second, plus processing; above that, events queued "+
			"(p50 / p99: %s). Sequential mode commits after every event, so its latency is the processing time plus queueing. "+
			"The 20 ms poll interval bounds the resolution of every latency figure", strings.Join(def, ", "))
		var polls []string
		for _, x := range r.results {
			if x.TP.PollEvery > 0 {
				polls = append(polls, ms(x.TP.PollEvery))
			}
		}
		if len(polls) > 0 {
			p(" (the polls actually came every %s on average, run by run)", strings.Join(polls, ", "))
		}
		p(".\n")
	}
}

// memoryAndNoise writes the paragraph on peak RSS, and the runs other processes disturbed.
func (r report) memoryAndNoise(p func(format string, args ...any)) {
	var peak int64
	for _, x := range r.results {
		peak = max(peak, x.PeakRSS)
	}
	p("- **Peak RSS** (%s at most) stays low because fetching is bounded: what all partitions hold between fetch and commit is one budget "+
		"(BILLING_MAX_INFLIGHT_BYTES, by default a thirty-second of the memory limit; docs/operations.md, Memory), and at most BILLING_CONCURRENCY (%d) events run at once.\n",
		mb(peak), r.env.Defaults.Concurrency)
	var busy []string
	for _, x := range r.results {
		if x.CPU.Other > 0.2 {
			busy = append(busy, fmt.Sprintf("%s at %s: %.2f cores", x.Mode, ms(x.Latency), x.CPU.Other))
		}
	}
	if len(busy) > 0 {
		p("- **Noise**: processes outside this benchmark used CPU during some runs (%s; load average %s at the start), "+
			"so those numbers are lower than on a quiet machine.\n", strings.Join(busy, ", "), r.env.LoadAvg)
	}
}
