package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// The recovery scenario: two replicas of the binary under test, with its
// own defaults, share one group on a fresh topic under a steady offered
// load, one order per record. Each order's wait is the time from its
// record's send to the provider's receipt of its charge: while steady,
// after a SIGKILL of one replica and after a replacement joins. An order
// whose partition stalls waits for the whole stall: the longest wait of a
// stage is how long it held the partitions it touched.

const (
	// recoveryRate is the offered load, orders/s.
	recoveryRate = 1000
	// stageFor is a stage's length (times -scale, at least 10 s): enough
	// for a session timeout, a rebalance and the queue they leave.
	stageFor = 15 * time.Second
)

// recovery is the outcome of the scenario.
type recovery struct {
	Rate     float64  `json:"offered_per_s"`
	StageS   float64  `json:"stage_s"` // the length of a stage
	Stages   []stage  `json:"stages"`
	Orders   int      `json:"orders_checked"`
	Problems []string `json:"problems,omitempty"`
}

// stage is one stretch of the scenario and the waits of the orders sent
// in it.
type stage struct {
	Name     string    `json:"name"`
	Orders   int       `json:"orders"`
	P50MS    float64   `json:"p50_ms"`
	P99MS    float64   `json:"p99_ms"`
	MaxMS    float64   `json:"max_ms"`
	from, to time.Time // the orders sent in [from, to)
}

// scenario is one run of the recovery scenario: its phase, its replicas
// and its load, with each order's send and first charge request.
type scenario struct {
	b             *bench
	p             *phase
	procs         []*consumerProc
	stopped       atomic.Bool // the load stops at its next tick
	mu            sync.Mutex
	sent, charged map[int64]time.Time
}

// runRecovery runs the scenario and checks that each order sent was
// charged exactly once.
func (b *bench) runRecovery(ctx context.Context) (recovery, error) {
	rec := recovery{Rate: recoveryRate, StageS: b.o.stageFor.Seconds()}
	p, err := b.newPhase(ctx, b.under, "recovery", drainPartitions, int(recoveryRate*(4*b.o.stageFor+2*time.Minute).Seconds()), nil)
	if err != nil {
		return rec, err
	}
	defer b.end(p)
	plan, err := p.plan()
	if err != nil {
		return rec, err
	}
	fmt.Fprintf(b.out, "recovery: two replicas, %d orders/s offered, stages of %v...\n", recoveryRate, b.o.stageFor)
	sc := &scenario{b: b, p: p, sent: map[int64]time.Time{}, charged: map[int64]time.Time{}}
	p.sim.SetHooks(paysim.Hooks{Received: sc.received})
	defer func() {
		for _, c := range sc.procs {
			c.Kill()
		}
	}()
	loadErr := make(chan error, 1)
	go func() { loadErr <- sc.produce(ctx, plan.Records) }()
	err = sc.stages(ctx, &rec)
	sc.stopped.Store(true)
	if lerr := <-loadErr; err == nil {
		err = lerr
	}
	if err != nil {
		return rec, err
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := harness.WaitDrained(dctx, b.o.brokers, p.topic, p.topic); err != nil {
		return rec, err
	}
	for _, c := range sc.procs {
		if exited, _ := c.Exited(); !exited {
			if err := c.Stop(45 * time.Second); err != nil {
				rec.Problems = append(rec.Problems, fmt.Sprintf("a replica did not stop cleanly: %v", err))
			}
		}
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sent := harness.Plan{Charged: map[int64]money.Amount{}}
	for order := range sc.sent {
		sent.Charged[order] = plan.Charged[order]
	}
	for i := range rec.Stages {
		rec.Stages[i].measure(sc.sent, sc.charged)
	}
	rec.Orders = len(sent.Charged)
	probs, err := b.verify(ctx, p, sent)
	rec.Problems = append(rec.Problems, probs...)
	return rec, err
}

// stages starts two replicas and, once their group is settled and the
// orders queued meanwhile are charged, runs each stage: its disturbance,
// then the load alone until stageFor has passed since the stage began.
func (sc *scenario) stages(ctx context.Context, rec *recovery) error {
	for range 2 {
		if err := sc.start(ctx); err != nil {
			return err
		}
	}
	if err := sc.settle(ctx); err != nil {
		return err
	}
	if err := sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	steps := []struct {
		name    string
		disturb func() error
	}{
		{"steady: two replicas", func() error { return nil }},
		{"crash: SIGKILL of one of two replicas", func() error { sc.procs[1].Kill(); return nil }},
		{"a replacement joins", func() error { return sc.start(ctx) }},
	}
	for _, st := range steps {
		s := stage{Name: st.name, from: time.Now()}
		if err := st.disturb(); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		if err := sleep(ctx, time.Until(s.from.Add(sc.b.o.stageFor))); err != nil {
			return err
		}
		s.to = time.Now()
		fmt.Fprintf(sc.b.out, "  %s: done\n", s.Name)
		rec.Stages = append(rec.Stages, s)
	}
	return nil
}

// start starts a replica and waits until it is ready.
func (sc *scenario) start(ctx context.Context) error {
	c, err := sc.b.start(sc.p)
	if err != nil {
		return err
	}
	sc.procs = append(sc.procs, c)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return c.WaitReady(ctx, c.addr)
}

// received is the simulator's hook: it keeps an order's first charge
// request.
func (sc *scenario) received(r paysim.Request) {
	now := time.Now()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if _, ok := sc.charged[r.OrderID]; !ok {
		sc.charged[r.OrderID] = now
	}
}

// measure sets the stage's waits from the send and charge times of every
// order; an order never charged is left to the exactly-once check.
func (s *stage) measure(sent, charged map[int64]time.Time) {
	var waits []time.Duration
	for order, at := range sent {
		if at.Before(s.from) || !at.Before(s.to) {
			continue
		}
		s.Orders++
		if c, ok := charged[order]; ok {
			waits = append(waits, c.Sub(at))
		}
	}
	slices.Sort(waits)
	at := func(q float64) float64 { // nearest rank
		if len(waits) == 0 {
			return 0
		}
		return float64(waits[int(math.Ceil(q*float64(len(waits))))-1]) / 1e6
	}
	s.P50MS, s.P99MS, s.MaxMS = at(0.5), at(0.99), at(1)
}

// settle waits until the broker describes the group as Stable with two
// members, each assigned partitions: the end of the rebalance as the
// coordinator sees it (a replica's /readyz may say ready before its first
// assignment).
func (sc *scenario) settle(ctx context.Context) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(sc.b.o.brokers...), Timeout: 5 * time.Second, Transport: tr}
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); {
		a, err := consumer.AssignmentOf(ctx, client, sc.p.topic, sc.p.topic)
		if err == nil && a.State == "Stable" && a.Members == 2 && a.Idle == 0 {
			return nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return errors.New("the group was not stable with two assigned members within 3 minutes")
}

// produce offers recs (one order each, keyed by its id) at recoveryRate,
// stamping each order's send: every 10 ms what is due, so that a slow
// write makes the next one larger and the rate holds on average. It stops
// between two writes: every order stamped sent was written.
func (sc *scenario) produce(ctx context.Context, recs []kafka.Message) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(sc.b.o.brokers...), Topic: sc.p.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, Transport: tr}
	defer w.Close()
	start := time.Now()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for sent := 0; !sc.stopped.Load(); {
		if sent == len(recs) {
			return fmt.Errorf("the load ran out of its %d records: the scenario outlasted its plan", len(recs))
		}
		if due := min(len(recs), int(time.Since(start).Seconds()*recoveryRate)+1); due > sent {
			now := time.Now()
			sc.mu.Lock()
			for _, r := range recs[sent:due] {
				order, _ := strconv.ParseInt(string(r.Key), 10, 64)
				sc.sent[order] = now
			}
			sc.mu.Unlock()
			if err := w.WriteMessages(ctx, recs[sent:due]...); err != nil {
				return fmt.Errorf("produce to %s: %w", sc.p.topic, err)
			}
			sent = due
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
