package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// The failing row (issue 19 item 7, SPEC §10): the default mode at 0 ms
// with one order in failingEvery answered 503 by the provider for
// failingFor, while it charges every other order, then recovering. It
// measures what one customer's trouble at the provider costs everyone
// else: the healthy events/s of a backlog drained with the failing
// orders beside the same backlog drained without them (interleaved, each
// -repeat times, the medians compared), and under a steady load lasting
// the failure, the healthy records' produce→commit latency (a record
// behind a failing one of its partition is committed only once that one
// is parked, after BILLING_PARK_AFTER), the healthy orders'
// produce→charged latency, and each failing order's time from the
// provider's recovery to its charge (the completer re-sends parked
// claims). The binary runs with its own defaults: nothing is tuned for
// this row.
const (
	failingEvery = 1000 // one order in 1,000 (0.1%) fails
	failingFor   = 60 * time.Second
	// failingSettleMax bounds the wait, after the recovery, for every
	// failing order's charge.
	failingSettleMax = 2 * time.Minute
	// lateCharge is the wait from produce to charge that a healthy order
	// of the steady load is counted late for: far above a healthy
	// charge (a batch, milliseconds), far below BILLING_PARK_AFTER.
	lateCharge = 5 * time.Second
)

// failingMode is the default mode (the binary's defaults) with failing
// orders.
var failingMode = mode{name: "failing", failing: true}

// failing decides which orders of a phase the provider fails, and for how
// long: each failing order is answered 503 from the first failing answer
// of the phase until failingFor after it, then charged like any other.
// Its methods are safe for concurrent use (the simulator calls
// unavailable from its handlers); a nil *failing fails nothing.
type failing struct {
	first int64        // the phase's first order id
	start atomic.Int64 // unix nanoseconds of the first failing answer; 0 before it
}

// newFailing makes one order in failingEvery of p fail at p's simulator,
// which answers the others after latency.
func newFailing(p *phase, latency time.Duration) *failing {
	f := &failing{first: p.firstOrder}
	p.sim.SetFaults(paysim.Faults{Latency: latency, Unavailable: f.unavailable})
	return f
}

// fails reports whether order is one of the failing orders.
func (f *failing) fails(order int64) bool {
	return (order-f.first)%failingEvery == failingEvery/2
}

// unavailable is the simulator's Faults.Unavailable.
func (f *failing) unavailable(order int64) bool {
	if !f.fails(order) {
		return false
	}
	now := time.Now().UnixNano()
	f.start.CompareAndSwap(0, now)
	return now-f.start.Load() < int64(failingFor)
}

// recoveredAt is when the provider recovers for the failing orders; zero
// while none has been answered yet.
func (f *failing) recoveredAt() time.Time {
	s := f.start.Load()
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(0, s).Add(failingFor)
}

// failingStats is what a phase with failing orders measured of them.
type failingStats struct {
	Orders int // failing orders among the phase's records
	Parked int // claims of the phase parked (ledger parked_at), failing orders or not
	// Recovery is each failing order's time from the provider's recovery
	// to its charge (the ledger's charged_at), ascending.
	Recovery []time.Duration
	// ChargeP50 and ChargeP99 are the healthy orders' produce→charged
	// latency (record timestamp to the ledger's charged_at), and Late how
	// many of them waited over lateCharge: steady load only.
	ChargeP50, ChargeP99 time.Duration
	Late                 int
	HealthyRecords       int // healthy records whose commit latency was measured (steady load)
}

// settle waits, after the drain or the load of phase p whose orders are
// p.firstOrder .. p.firstOrder+n-1, for the provider's recovery and then
// for every failing order's charge in the ledger, and records in r how
// long after the recovery each was charged and how many claims were
// parked. A nil *failing does nothing.
func (f *failing) settle(ctx context.Context, p *phase, n int, r *result) error {
	if f == nil {
		return nil
	}
	st := &failingStats{}
	r.Failing = st
	var orders []int64
	for o := p.firstOrder; o < p.firstOrder+int64(n); o++ {
		if f.fails(o) {
			orders = append(orders, o)
		}
	}
	st.Orders = len(orders)
	rec := f.recoveredAt()
	if rec.IsZero() {
		r.notes = append(r.notes, fmt.Sprintf("no failing order was sent to the provider (%d in the records)", len(orders)))
		return nil
	}
	deadline := rec.Add(failingSettleMax)
	for {
		var charged int
		if err := p.db.QueryRow(ctx, `SELECT count(*) FROM charge WHERE order_id = ANY($1) AND status = 'charged'`, orders).Scan(&charged); err != nil {
			return fmt.Errorf("count the failing orders charged: %w", err)
		}
		if time.Now().After(rec) && charged == len(orders) {
			break
		}
		if time.Now().After(deadline) {
			r.problems = append(r.problems, fmt.Sprintf("%s: %d of %d failing orders charged %v after the provider recovered",
				p.topic, charged, len(orders), failingSettleMax))
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	rows, err := p.db.Query(ctx, `SELECT charged_at FROM charge WHERE order_id = ANY($1) AND status = 'charged'`, orders)
	if err != nil {
		return fmt.Errorf("read the failing orders' charges: %w", err)
	}
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			return err
		}
		st.Recovery = append(st.Recovery, at.Sub(rec))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	slices.Sort(st.Recovery)
	return p.db.QueryRow(ctx, `SELECT count(*) FROM charge WHERE order_id >= $1 AND order_id < $2 AND parked_at IS NOT NULL`,
		p.firstOrder, p.firstOrder+p.orders).Scan(&st.Parked)
}

// failingRun is the row's outcome.
type failingRun struct {
	// Clean and Failing are the median drains of the same backlog
	// without and with failing orders.
	Clean, Failing result
	// Steady is the steady load with failing orders: its P50/P99 are the
	// healthy records' produce→commit latency, its Failing the charge
	// latencies and the recovery.
	Steady result
	// ParkAfter and CommitInterval are the binary's defaults of
	// BILLING_PARK_AFTER and BILLING_KAFKA_COMMIT_INTERVAL.
	ParkAfter, CommitInterval time.Duration
}

// failingRow measures the row: the clean and the failing drains
// interleaved, -repeat times each, then the steady load with failing
// orders at half the clean median's events/s (capped by -steady-cap) for
// failingFor.
func (b *bench) failingRow(ctx context.Context) (failingRun, error) {
	var fr failingRun
	var err error
	if fr.ParkAfter, err = helpDuration(ctx, b.o.bin, "BILLING_PARK_AFTER"); err != nil {
		return fr, err
	}
	if fr.CommitInterval, err = helpDuration(ctx, b.o.bin, "BILLING_KAFKA_COMMIT_INTERVAL"); err != nil {
		return fr, err
	}
	def := modes[len(modes)-1]
	size := backlog(def, 0, b.o.scale)
	fmt.Fprintf(b.out, "failing: %d records backlog, drained %d times without and with 1 order in %d failing for %v...\n",
		size, b.o.repeat, failingEvery, failingFor)
	var clean, failed []result
	for i := range b.o.repeat {
		c := result{Mode: def.name, Backlog: size}
		if err := b.backlogPhase(ctx, def, 0, &c); err != nil {
			return fr, fmt.Errorf("failing row, clean drain: %w", err)
		}
		f := result{Mode: failingMode.name, Backlog: size}
		if err := b.backlogPhase(ctx, failingMode, 0, &f); err != nil {
			return fr, fmt.Errorf("failing row, failing drain: %w", err)
		}
		fmt.Fprintf(b.out, "  drain %d of %d: %.0f events/s without, %.0f with failing orders (%s)\n",
			i+1, b.o.repeat, c.TP.Rate, f.TP.Rate, mergeFailing([]result{f}).recoveryLine())
		clean, failed = append(clean, c), append(failed, f)
	}
	fr.Clean, fr.Failing = medianRun(clean), medianRun(failed)
	fr.Failing.Failing = mergeFailing(failed)
	fr.Steady = result{Mode: failingMode.name, SteadyRate: min(b.o.steadyCap, fr.Clean.TP.Rate/2)}
	fr.Steady.SteadyRecords = max(10, int(fr.Steady.SteadyRate*failingFor.Seconds()))
	fmt.Fprintf(b.out, "  steady load with failing orders: %d records at %.0f/s...\n", fr.Steady.SteadyRecords, fr.Steady.SteadyRate)
	err = b.failingSteady(ctx, &fr.Steady)
	if fr.Steady.Failing == nil { // the load ended before its failing orders were measured
		fr.Steady.Failing = &failingStats{}
	}
	if err != nil {
		return fr, fmt.Errorf("failing row, steady load: %w", err)
	}
	fmt.Fprintln(b.out, fr.line())
	return fr, nil
}

// mergeFailing joins the failing stats of several drains: every failing
// order's recovery time, the orders and parked claims summed.
func mergeFailing(runs []result) *failingStats {
	all := &failingStats{}
	for _, x := range runs {
		if x.Failing == nil {
			continue
		}
		all.Orders += x.Failing.Orders
		all.Parked += x.Failing.Parked
		all.Recovery = append(all.Recovery, x.Failing.Recovery...)
	}
	slices.Sort(all.Recovery)
	return all
}

// helpDuration reads the default of the duration variable name from
// `bin help`.
func helpDuration(ctx context.Context, bin, name string) (time.Duration, error) {
	out, err := exec.CommandContext(ctx, bin, "help").Output()
	if err != nil {
		return 0, fmt.Errorf("%s help: %w (run make build)", bin, err)
	}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == name {
			d, err := time.ParseDuration(f[2])
			if err != nil {
				return 0, fmt.Errorf("billing-consumer help: default of %s is %q, not a duration", name, f[2])
			}
			return d, nil
		}
	}
	return 0, fmt.Errorf("billing-consumer help does not list %s", name)
}

// failingSteady starts a consumer on a fresh topic whose orders fail as
// the row says, offers it r.SteadyRecords records at r.SteadyRate once it
// has joined its group (failingFor of load: the failure lasts about as
// long), waits until every record is committed and every failing order
// charged, and measures the healthy records' produce→commit latency
// (r.P50, r.P99) and the healthy orders' produce→charged latency.
func (b *bench) failingSteady(ctx context.Context, r *result) error {
	s, err := b.startSteady(ctx, failingMode, 0, b.o.bin, r)
	if err != nil {
		return err
	}
	defer s.close()
	p := s.p
	if err := p.fail.settle(ctx, p, len(s.recs), r); err != nil {
		return err
	}
	samples, back, err := b.endSteady(ctx, s, r, "the failing orders' charge")
	if err != nil {
		return err
	}
	healthy := slices.DeleteFunc(slices.Clone(back), func(x record) bool { return p.fail.fails(x.orderID) })
	lat, missing := commitLatencies(samples, healthy)
	r.P50, r.P99, r.LatencyMissing = percentile(lat, 0.5), percentile(lat, 0.99), missing
	if err := b.chargeLatencies(ctx, p, healthy, r.Failing); err != nil {
		return err
	}
	return b.verify(ctx, p, r, true)
}

// chargeLatencies records in st the produce→charged latency of the
// healthy records' orders: from each record's timestamp (its send time)
// to its order's charged_at in the ledger.
func (b *bench) chargeLatencies(ctx context.Context, p *phase, healthy []record, st *failingStats) error {
	sent := make(map[int64]time.Time, len(healthy))
	for _, x := range healthy {
		sent[x.orderID] = x.time
	}
	rows, err := p.db.Query(ctx, `SELECT order_id, charged_at FROM charge WHERE order_id >= $1 AND order_id < $2 AND status = 'charged'`,
		p.firstOrder, p.firstOrder+p.orders)
	if err != nil {
		return fmt.Errorf("read the healthy orders' charges: %w", err)
	}
	defer rows.Close()
	var lat []time.Duration
	for rows.Next() {
		var order int64
		var at time.Time
		if err := rows.Scan(&order, &at); err != nil {
			return err
		}
		if t, ok := sent[order]; ok {
			lat = append(lat, at.Sub(t))
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	slices.Sort(lat)
	st.HealthyRecords = len(healthy)
	st.ChargeP50, st.ChargeP99 = percentile(lat, 0.5), percentile(lat, 0.99)
	i, _ := slices.BinarySearch(lat, lateCharge+1)
	st.Late = len(lat) - i
	return nil
}
