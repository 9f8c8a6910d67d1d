package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// failingRateTarget is issue 19's bound of the healthy events/s with
// failing orders, as a share of the same drain without them.
const failingRateTarget = 0.9

// failingRecoveryTarget is issue 19's bound of a parked order's charge
// after the provider's recovery.
const failingRecoveryTarget = 30 * time.Second

// recoveryLine summarizes the failing orders of one run: how many, parked,
// and the fastest and slowest charge after the recovery.
func (st *failingStats) recoveryLine() string {
	return fmt.Sprintf("%d failing orders, %d claims parked, charged %s to %s after the provider's recovery",
		st.Orders, st.Parked, secs(st.recovery(0)), secs(st.recovery(1)))
}

// recovery is the q-quantile of the failing orders' time from the
// recovery to their charge (0: the fastest, 1: the slowest).
func (st *failingStats) recovery(q float64) time.Duration {
	if len(st.Recovery) == 0 {
		return 0
	}
	if q <= 0 {
		return st.Recovery[0]
	}
	return percentile(st.Recovery, q)
}

// wait formats a latency that may be seconds long: in seconds from 10 s
// on, else in milliseconds.
func wait(d time.Duration) string {
	if d >= 10*time.Second {
		return secs(d)
	}
	return ms(d)
}

// ratio is the failing drain's events/s over the clean one's.
func (fr failingRun) ratio() float64 {
	if fr.Clean.TP.Rate <= 0 {
		return 0
	}
	return fr.Failing.TP.Rate / fr.Clean.TP.Rate
}

// latencyBound is issue 19's bound of the healthy records' p99
// produce→commit: BILLING_PARK_AFTER plus one commit interval.
func (fr failingRun) latencyBound() time.Duration { return fr.ParkAfter + fr.CommitInterval }

// line is the row's summary for the terminal.
func (fr failingRun) line() string {
	s := fmt.Sprintf("  failing: %.0f events/s with failing orders vs %.0f without (%.2f×); steady %.0f/s: healthy produce→commit p50 %s p99 %s, "+
		"produce→charged p50 %s p99 %s; drains: %s; steady: %s",
		fr.Failing.TP.Rate, fr.Clean.TP.Rate, fr.ratio(), fr.Steady.SteadyRate, wait(fr.Steady.P50), wait(fr.Steady.P99),
		ms(fr.Steady.Failing.ChargeP50), ms(fr.Steady.Failing.ChargeP99), fr.Failing.Failing.recoveryLine(), fr.Steady.Failing.recoveryLine())
	for _, x := range []result{fr.Clean, fr.Failing, fr.Steady} {
		for _, p := range x.problems {
			s += "\n    FAILED: " + p
		}
		for _, n := range x.notes {
			s += "\n    note: " + n
		}
	}
	return s
}

// printFailing writes the row to the terminal.
func (r report) printFailing(w io.Writer) {
	if r.failing != nil {
		fmt.Fprintln(w, strings.TrimPrefix(r.failing.line(), "  "))
	}
}

// failingTargets are the row's three targets of issue 19.
func (r report) failingTargets() []target {
	fr := r.failing
	if fr == nil {
		return nil
	}
	slowest := fr.Steady.Failing.recovery(1)
	return []target{
		{fmt.Sprintf("0.1%% of orders failing: healthy events/s >= %.0f%% of the drain without", 100*failingRateTarget),
			fmt.Sprintf("%.0f of %.0f events/s (%.2f×)", fr.Failing.TP.Rate, fr.Clean.TP.Rate, fr.ratio()), fr.ratio() >= failingRateTarget, false},
		{fmt.Sprintf("0.1%% of orders failing: healthy p99 produce→commit < BILLING_PARK_AFTER + commit interval (%v)", fr.latencyBound()),
			wait(fr.Steady.P99), fr.Steady.P99 > 0 && fr.Steady.P99 < fr.latencyBound(), false},
		{fmt.Sprintf("parked orders charged <= %v after the provider's recovery", failingRecoveryTarget),
			secs(slowest), len(fr.Steady.Failing.Recovery) > 0 && slowest <= failingRecoveryTarget, false},
	}
}

// failingFailures are the exactly-once problems of the row's runs.
func (r report) failingFailures() []string {
	if r.failing == nil {
		return nil
	}
	var f []string
	for _, x := range []result{r.failing.Clean, r.failing.Failing, r.failing.Steady} {
		f = append(f, x.problems...)
	}
	return f
}

// failingMarkdown writes the row's section of docs/benchmarks.md.
func (r report) failingMarkdown(b *strings.Builder) {
	fr := r.failing
	if fr == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	st, ds := fr.Steady.Failing, fr.Failing.Failing
	p("\n## Orders failing at the provider\n\n")
	p("The default mode at 0 ms with **one order in %d (0.1%%) answered 503 by the provider for %v** from its first failing answer, "+
		"while every other order is charged; then the provider recovers for them. The binary runs with its own defaults "+
		"(BILLING_PARK_AFTER=%v, BILLING_KAFKA_COMMIT_INTERVAL=%v): a failing event is retried for BILLING_PARK_AFTER, then parked "+
		"(its record committed, its claim re-sent by the completer until it is charged). **Drains**: the default row's backlog (%d records) is "+
		"drained %d times without and %d times with the failing orders, interleaved, each on a fresh topic, measured as above (the middle "+
		"60%% of the drain; the events finished include the parked ones, at most 0.1%%); each failing drain then waits for the recovery and "+
		"the failing orders' charge before the exactly-once check. **Steady load**: half the clean median's events/s (capped at %.0f/s) "+
		"for %v, the failure lasting about as long: *produce→commit* of each healthy record as above (a record behind a failing one of "+
		"its partition is committed only when that one is parked), *produce→charged* of each healthy order from its record's timestamp "+
		"to its ledger charged_at, and each failing order's time from the recovery to its charged_at.\n\n",
		failingEvery, failingFor, fr.ParkAfter, fr.CommitInterval, fr.Clean.Backlog, len(fr.Clean.Spread), len(fr.Failing.Spread),
		r.opts.steadyCap, failingFor)
	p("| | without failing orders | with 0.1%% failing |\n|---|---:|---:|\n")
	p("| events/s, drain (median, range) | %.0f%s | **%.0f**%s (%.2f×) |\n", fr.Clean.TP.Rate, fr.Clean.spread(spreadRate),
		fr.Failing.TP.Rate, fr.Failing.spread(spreadRate), fr.ratio())
	p("| CPU µs/event, drain | %.0f | %.0f |\n", fr.Clean.Cost.CPUPerEvent(), fr.Failing.Cost.CPUPerEvent())
	p("\n| steady load with failing orders | |\n|---|---:|\n")
	p("| offered load | %.0f/s × %d records (%d failing) |\n", fr.Steady.SteadyRate, fr.Steady.SteadyRecords, st.Orders)
	p("| healthy produce→commit p50 / p99 | %s / **%s** (bound %v) |\n", wait(fr.Steady.P50), wait(fr.Steady.P99), fr.latencyBound())
	p("| healthy produce→charged p50 / p99 | %s / **%s**; %d orders over %v |\n", ms(st.ChargeP50), ms(st.ChargeP99), st.Late, lateCharge)
	p("| failing orders charged after the recovery, fastest / median / slowest | %s / %s / **%s** |\n",
		secs(st.recovery(0)), secs(st.recovery(0.5)), secs(st.recovery(1)))
	p("| claims parked | %d |\n", st.Parked)
	p("\nIn the failing drains: %s. Once a drain's healthy records are done nothing else is in flight, so the failing events meet "+
		"no success and the outage rule pauses them (nothing is parked in an outage) until the recovery; a drain slower than "+
		"BILLING_PARK_AFTER parks them while it lasts.\n", ds.recoveryLine())
	var notes []string
	for _, x := range []result{fr.Clean, fr.Failing, fr.Steady} {
		for _, n := range x.problems {
			notes = append(notes, "FAILED: "+n)
		}
		notes = append(notes, x.notes...)
	}
	if len(notes) > 0 {
		p("\nProblems and notes of the row:\n\n")
		for _, n := range notes {
			p("- %s\n", n)
		}
	}
}

// failingSummary is the README's line on the row.
func (r report) failingSummary() string {
	fr := r.failing
	if fr == nil {
		return ""
	}
	return fmt.Sprintf("\nWith 0.1%% of orders failing at the provider for %v (default mode, 0 ms, BILLING_PARK_AFTER=%v): **%.0f** healthy events/s "+
		"(%.2f× the same drain without), healthy p99 produce→commit **%s** and produce→charged %s; the parked orders were charged at most **%s** after the provider recovered.\n",
		failingFor, fr.ParkAfter, fr.Failing.TP.Rate, fr.ratio(), wait(fr.Steady.P99), ms(fr.Steady.Failing.ChargeP99), secs(fr.Steady.Failing.recovery(1)))
}
