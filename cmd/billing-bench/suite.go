package main

import (
	"context"
	"fmt"
	"time"
)

// measureAll runs every part of the bench that the options select, in
// order: each mode at each provider latency (with -baseline, the
// baseline's default mode right after the same run of the binary under
// test, so that both see the same machine), the backlog-size sweep, and
// the recovery scenario (the baseline's after it) and the row with
// failing orders (failing.go, the binary under test only); the results go
// into rep.
// measureMode measures m at latency l with the binary under test and,
// when withBaseline and there is a -baseline binary, with that one right
// after; each result goes into rep and is printed.
func (b *bench) measureMode(ctx context.Context, rep *report, m mode, l time.Duration, withBaseline bool) error {
	for _, baseline := range []bool{false, true} {
		if baseline && (b.o.baseline == "" || !withBaseline) {
			continue
		}
		r, err := b.measure(ctx, m, l, baseline)
		if err != nil {
			return fmt.Errorf("%s at %v%s: %w", m.name, l, r.binLabel(), err)
		}
		if baseline {
			rep.baseline = append(rep.baseline, r)
		} else {
			rep.results = append(rep.results, r)
		}
		fmt.Fprintln(b.out, r.line())
	}
	return nil
}

func (b *bench) measureAll(ctx context.Context, rep *report) error {
	o := b.o
	for _, m := range modes {
		for _, l := range latencies {
			if !o.selected(fmt.Sprintf("%s:%v", m.name, l)) {
				continue
			}
			if err := b.measureMode(ctx, rep, m, l, !m.sequential); err != nil {
				return err
			}
		}
	}
	if err := b.measureClients(ctx, rep); err != nil {
		return err
	}
	if !o.skipSweep && o.selected("sweep") {
		var err error
		if rep.sweep, err = b.runSweep(ctx); err != nil {
			return err
		}
	}
	if !o.skipPartitions && o.selected("partitions") {
		var err error
		if rep.parts, err = b.runPartitionSweep(ctx); err != nil {
			return err
		}
	}
	if !o.skipRecovery && o.selected("recovery") {
		for _, baseline := range []bool{false, true} {
			if baseline && o.baseline == "" {
				continue
			}
			rec, err := b.recoveryScenario(ctx, baseline)
			if err != nil {
				return fmt.Errorf("recovery scenario: %w", err)
			}
			rep.recovery = append(rep.recovery, rec)
		}
	}
	if !o.skipFailing && o.selected("failing") {
		fr, err := b.failingRow(ctx)
		if err != nil {
			return err
		}
		rep.failing = &fr
	}
	return nil
}

// failures are the exactly-once problems of every run of the report.
func (r report) failures() []string {
	var f []string
	for _, x := range r.all() {
		f = append(f, x.problems...)
	}
	for _, rec := range r.recovery {
		f = append(f, rec.problems...)
	}
	for _, x := range r.parts {
		f = append(append(f, x.After.problems...), x.Before.problems...)
	}
	return append(f, r.failingFailures()...)
}
