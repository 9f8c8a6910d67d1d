package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// The recovery scenario: two replicas of the binary, with its own Kafka
// group defaults, share one group on a fresh topic under a steady offered
// load; one is killed (SIGKILL), a replacement joins, then the other is
// restarted as a rolling update does it (SIGTERM, and a new process at
// once). The committed offsets are polled all along.
const (
	// recoverySettle is how long each stage keeps being watched after
	// every partition has advanced again, to catch a late stall (a
	// rebalance that a heartbeat discovers after the first advances).
	recoverySettle = 3 * time.Second
	// recoveryStageMax bounds each stage.
	recoveryStageMax = 3 * time.Minute
	// recoveryOrdersFor sizes the order-id range of the scenario: the
	// offered load for this long.
	recoveryOrdersFor = 10 * time.Minute
)

// recovery is the outcome of the scenario.
type recovery struct {
	Baseline bool
	Rate     float64           // offered load, events/s
	Settings map[string]string // the binary's group settings (from its help) the scenario ran with
	Stages   []stage
	Records  int // produced in all
	Charges  int // orders verified charged exactly once
	problems []string
	notes    []string
}

// stage is one disturbance of the group and how the partitions fared.
type stage struct {
	Name string
	// AllProgress is the time from the disturbance until every
	// partition's committed offset had advanced beyond its value at the
	// moment the group had settled again (at once after a kill: a
	// partition whose owner was killed stands still until the group
	// reassigns it; after a start or a SIGTERM, once the broker describes
	// the group as stable with its new members).
	AllProgress time.Duration
	// LongestStall is the longest time any one partition made no progress
	// (between two advances of its committed offset) around the stage:
	// under the steady load each partition normally advances on every
	// commit tick.
	LongestStall   time.Duration
	StallPartition int
	from, to       time.Time
	settled        time.Time // when the disturbance's group change was complete
}

// recoveryScenario runs the scenario with the binary under test, or the
// -baseline binary.
func (b *bench) recoveryScenario(ctx context.Context, baseline bool) (recovery, error) {
	rec := recovery{Baseline: baseline, Rate: b.o.recoveryRate}
	r := &result{Mode: "default", Baseline: baseline}
	bin := b.bin(r)
	d, err := readDefaults(ctx, bin)
	if err != nil {
		return rec, err
	}
	rec.Settings = d.Group
	def := modes[len(modes)-1]
	p, err := b.newPhase(ctx, def, 0, "recovery", int(b.o.recoveryRate*recoveryOrdersFor.Seconds()), baseline)
	if err != nil {
		return rec, err
	}
	defer b.endPhase(p)
	fmt.Fprintf(b.out, "recovery%s: two replicas, %.0f events/s offered, group settings %v...\n", r.binLabel(), rec.Rate, rec.Settings)

	poll := startPoller(ctx, b.o.brokers, p.topic, p.group, partitions, b.o.poll)
	defer poll.finish()
	rs := &replicas{b: b, bin: bin, env: p.env, topic: p.topic, group: p.group}
	defer rs.killAll()
	load := b.startLoad(ctx, p, rec.Rate)
	if err := b.disturbances(ctx, &rec, poll, rs); err != nil {
		_, _ = load.stop() // the scenario failed already: its error is the one to tell
		return rec, err
	}
	if rec.Records, err = load.stop(); err != nil {
		return rec, err
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = harness.WaitDrained(dctx, b.o.brokers, p.topic, p.group)
	cancel()
	if err != nil {
		return rec, err
	}
	for _, pr := range rs.procs[len(rs.procs)-2:] {
		if err := pr.Stop(45 * time.Second); err != nil {
			rec.problems = append(rec.problems, fmt.Sprintf("a replica did not stop cleanly: %v", err))
		}
	}
	samples := poll.finish()
	for i := range rec.Stages {
		rec.Stages[i].measure(samples)
	}
	if err := b.verify(ctx, p, r, true); err != nil {
		return rec, err
	}
	rec.Charges, rec.problems, rec.notes = r.Charges, append(rec.problems, r.problems...), r.notes
	return rec, nil
}

// replicas are the consumer processes of the scenario, all of one binary
// with one environment.
type replicas struct {
	b     *bench
	bin   string
	env   []string
	topic string
	group string
	procs []*consumerProc
}

// settle waits until the broker describes the group as stable with
// members assigned members.
func (rs *replicas) settle(ctx context.Context, members int) error {
	return waitGroup(ctx, rs.b.o.brokers, rs.topic, rs.group, members, recoveryStageMax)
}

// start starts a replica and waits until it is ready (a group member).
func (rs *replicas) start(ctx context.Context) (*consumerProc, error) {
	pr, err := startConsumer(rs.bin, rs.env, rs.b.log)
	if err != nil {
		return nil, err
	}
	rs.procs = append(rs.procs, pr)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return pr, pr.waitReady(ctx)
}

// killAll kills every replica still running.
func (rs *replicas) killAll() {
	for _, pr := range rs.procs {
		pr.Kill()
	}
}

// disturbances starts two replicas, waits until every partition makes
// progress under the load, then runs the three stages: SIGKILL of one, a
// replacement joining, and the rolling restart of the other (SIGTERM,
// and a new one started at once).
func (b *bench) disturbances(ctx context.Context, rec *recovery, poll *poller, rs *replicas) error {
	a, err := rs.start(ctx)
	if err != nil {
		return err
	}
	victim, err := rs.start(ctx)
	if err != nil {
		return err
	}
	if err := rs.settle(ctx, 2); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := b.untilAllProgress(ctx, poll, time.Now()); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	time.Sleep(recoverySettle)
	kill := func() error { victim.Kill(); return nil }
	if err := b.stage(ctx, rec, poll, "crash: SIGKILL of one of two replicas", kill); err != nil {
		return err
	}
	join := func() error {
		if _, err := rs.start(ctx); err != nil {
			return err
		}
		return rs.settle(ctx, 2)
	}
	if err := b.stage(ctx, rec, poll, "a replacement joins", join); err != nil {
		return err
	}
	// The old replica is a member until it has drained and left: the
	// group is settled once it has exited and the new one is assigned.
	rolling := func() error {
		stopped := make(chan error, 1)
		go func() { stopped <- a.Stop(45 * time.Second) }()
		_, err := rs.start(ctx)
		if err := <-stopped; err != nil {
			rec.problems = append(rec.problems, fmt.Sprintf("the replica stopped by SIGTERM did not exit cleanly: %v", err))
		}
		if err != nil {
			return err
		}
		return rs.settle(ctx, 2)
	}
	return b.stage(ctx, rec, poll, "rolling restart: SIGTERM of one, a new one started", rolling)
}

// stage runs one disturbance and watches the group until every partition
// has advanced after it, and recoverySettle more.
func (b *bench) stage(ctx context.Context, rec *recovery, poll *poller, name string, disturb func() error) error {
	s := stage{Name: name, from: time.Now()}
	if err := disturb(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	s.settled = time.Now()
	if err := b.untilAllProgress(ctx, poll, s.settled); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	time.Sleep(recoverySettle)
	s.to = time.Now()
	s.measure(poll.snapshot())
	fmt.Fprintf(b.out, "  %s: every partition advancing again %.1f s after it\n", name, s.AllProgress.Seconds())
	rec.Stages = append(rec.Stages, s)
	return nil
}

// measure computes the stage's figures from the polled samples.
func (s *stage) measure(samples []sample) {
	after, _ := progressAfter(samples, s.settled)
	s.AllProgress = s.settled.Sub(s.from) + after
	s.LongestStall, s.StallPartition = longestStall(samples, s.from, s.to)
}

// untilAllProgress waits until every partition's committed offset has
// advanced beyond its value at t.
func (b *bench) untilAllProgress(ctx context.Context, poll *poller, t time.Time) error {
	deadline := time.Now().Add(recoveryStageMax)
	for {
		if _, ok := progressAfter(poll.snapshot(), t); ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("some partition made no progress within %v: %v", recoveryStageMax, poll.last().committed)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// progressAfter returns how long after t every partition's committed
// offset had advanced beyond its value at t (at the last sample at or
// before t), and false if some partition never did in samples.
func progressAfter(samples []sample, t time.Time) (time.Duration, bool) {
	var base []int64
	for _, s := range samples {
		if !s.at.After(t) {
			base = s.committed
		}
	}
	if len(samples) == 0 {
		return 0, false
	}
	if base == nil {
		base = make([]int64, len(samples[0].committed))
	}
	var worst time.Duration
	for part := range base {
		found := false
		for _, s := range samples {
			if s.at.After(t) && s.committed[part] > base[part] {
				worst, found = max(worst, s.at.Sub(t)), true
				break
			}
		}
		if !found {
			return worst, false
		}
	}
	return worst, true
}

// longestStall returns the longest time any partition went without an
// advance of its committed offset, over the gaps between advances that
// overlap [from, to] (a gap still open at to ends at to), and that
// partition.
func longestStall(samples []sample, from, to time.Time) (time.Duration, int) {
	var worst time.Duration
	worstPart := -1
	if len(samples) == 0 {
		return 0, -1
	}
	for part := range samples[0].committed {
		var last time.Time // the latest advance before the gap
		prev := int64(-1)
		consider := func(end time.Time) {
			if !last.IsZero() && end.After(from) && last.Before(to) && end.Sub(last) > worst {
				worst, worstPart = end.Sub(last), part
			}
		}
		for _, s := range samples {
			if s.at.After(to) {
				break
			}
			if c := s.committed[part]; prev >= 0 && c > prev {
				consider(s.at)
				last = s.at
			} else if prev < 0 {
				last = s.at
			}
			prev = s.committed[part]
		}
		consider(to)
	}
	return worst, worstPart
}

// steadyLoad produces records at a steady rate until stopped.
type steadyLoad struct {
	cancel func()
	done   chan struct{}
	mu     sync.Mutex
	sent   int
	err    error
}

// startLoad offers records of p's orders at rate/s, one second's worth at
// a time, until stop.
func (b *bench) startLoad(ctx context.Context, p *phase, rate float64) *steadyLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &steadyLoad{cancel: cancel, done: make(chan struct{})}
	chunk := max(1, int(rate))
	go func() {
		defer close(l.done)
		for next := p.firstOrder; next+int64(chunk) <= p.firstOrder+p.orders; next += int64(chunk) {
			recs, err := workload(next, chunk)
			if err == nil {
				err = produceSteady(ctx, b.o.brokers, p.topic, recs, rate)
			}
			l.mu.Lock()
			if err == nil {
				l.sent += chunk
			} else if ctx.Err() == nil {
				l.err = err
			}
			l.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return l
}

// stop ends the load and returns how many records were acknowledged (a
// chunk cut short may have written some more: the checks read the topic).
func (l *steadyLoad) stop() (int, error) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.sent, fmt.Errorf("steady load: %w", l.err)
	}
	return l.sent, nil
}
