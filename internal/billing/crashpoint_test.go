package billing_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// The claim protocol's steps, as a clean run of one fresh event makes
// them: the claim (one statement, committed on its own: "commit A"), then
// the charge transaction ("begin B", the dedup insert, the request to the
// provider, the record, "commit B"). The offset commit follows Process;
// its loss is a redelivery of a finished event, the last case below.
var protocol = []string{"claim", "begin", "dedup insert", "charge", "record", "commit"}

// TestProtocolSteps asserts that the enumeration above is the protocol, so
// that the crash-point tests cover every step by construction.
func TestProtocolSteps(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		in := newInjector()
		svc := e.biller(t, k, faultDB{e.pool, in}, faultCharger{e.charger, in})
		if res, err := svc.Process(context.Background(), event(7000, 100)); err != nil || res.Outcome != billing.Charged {
			t.Fatalf("clean run: %+v, %v", res, err)
		}
		if got := in.trace(); !slices.Equal(got, protocol) {
			t.Fatalf("protocol steps = %q, want %q", got, protocol)
		}
	})
}

// For every step, fail the connection or the process exactly there, before
// the step takes effect and after it (its answer lost). Then a second,
// distinct event for the same order arrives (another record key, another
// replica) before anything recovers, and then recovery runs as production
// does — the completer's pass and the redelivery of both events by a
// restarted process. SPEC §6/§9 must hold: the provider took exactly one
// charge, the ledger holds one charged row with that charge's id, and no
// claim is left unsettled. It runs against both billers (biller_test.go).
func TestCrashAtEveryStep(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) { crashAtEveryStep(t, k) })
}

func crashAtEveryStep(t *testing.T, kind billerKind) {
	e := newEnv(t, "secret-token")
	order := int64(7100)
	for k, step := range append(protocol, "offset") {
		for _, after := range []bool{false, true} {
			for _, mode := range []faultMode{connLost, crash} {
				for _, completerFirst := range []bool{false, true} {
					if step == "offset" && (!after || mode == connLost) {
						continue // the offset step is only "finished, then the process died"
					}
					order++
					name := fmt.Sprintf("%s/%s/after=%v/completer-first=%v", step, mode, after, completerFirst)
					t.Run(name, func(t *testing.T) {
						crashAt(t, e, kind, order, k, after, mode, completerFirst)
					})
				}
			}
		}
	}
}

func crashAt(t *testing.T, e *env, kind billerKind, order int64, k int, after bool, mode faultMode, completerFirst bool) {
	ev := event(order, 4321)
	in := newInjector()
	in.failAt, in.after, in.mode = k, after, mode
	if k == len(protocol) {
		in.failAt = -1 // the offset: Process finishes, the commit is lost
	}
	svc := e.biller(t, kind, faultDB{e.pool, in}, faultCharger{e.charger, in})
	ctx := billing.WithAttempt(context.Background()) // the delivery and its retries
	res, err := svc.Process(ctx, ev)
	t.Logf("faulty run: %+v, %v (ops %q)", res, err, in.trace())
	if mode == connLost && err != nil {
		// The process lives on: the pipeline retries the same event.
		if _, err := settle(ctx, t, svc, ev); err != nil && !fault.Is(err, fault.Transient) && !fault.Is(err, fault.Systemic) {
			t.Fatalf("retry after the cut: %v", err)
		}
	}
	// Another replica gets a distinct event for the order now. It may
	// charge only if the first event's claim never committed.
	ctx = context.Background() // another process: other attempts
	fresh := e.biller(t, kind, e.pool, e.charger)
	other := event(order, 4321)
	ores, oerr := fresh.Process(ctx, other)
	t.Logf("other event meanwhile: %+v, %v", ores, oerr)
	// A restarted process: the completer may come first, then the
	// redeliveries (the offsets were never committed, or were lost).
	if completerFirst {
		e.completePass(t, 2*time.Minute)
	}
	res, err = settle(ctx, t, fresh, ev)
	if err != nil || (res.Outcome != billing.Charged && res.Outcome != billing.Duplicate && res.Outcome != billing.DuplicateOrder) {
		t.Fatalf("redelivery: %+v, %v; want charged, duplicate or duplicate_order", res, err)
	}
	if ores, oerr = settle(ctx, t, fresh, other); oerr != nil || ores.Outcome == "" {
		t.Fatalf("the other event: %+v, %v; want an outcome", ores, oerr)
	}
	e.assertChargedOnce(t, ev)
}

// Two distinct events for one order (same amount and customer, another
// record key), interleaved at every pair of steps: the first paused before
// its step i, the second run until its step j (or its end, or until it
// waits in Postgres), then the first resumed, then the second. Whatever
// the interleaving, the order is charged once: one event charged, the
// other a duplicate_order. It runs against both billers.
func TestTwoEventsInterleavedAtEveryPairOfSteps(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		order := int64(7500)
		for i := range len(protocol) + 1 {
			for j := range len(protocol) + 1 {
				order++
				t.Run(fmt.Sprintf("first-before-%d/second-before-%d", i, j), func(t *testing.T) {
					interleave(t, e, k, order, i, j)
				})
			}
		}
	})
}

// gated runs Process on its own goroutine, pausing before operation k
// until released. reached is closed when it pauses or finishes.
type gated struct {
	reached, release, done chan struct{}
	res                    billing.Result
	err                    error
}

func startGated(e *env, t *testing.T, kind billerKind, ev events.OrderConfirmed, k int) *gated {
	g := &gated{reached: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	in := newInjector()
	var once sync.Once
	in.gate = func(n int, _ string) {
		if n == k {
			once.Do(func() { close(g.reached) })
			<-g.release
		}
	}
	svc := e.biller(t, kind, faultDB{e.pool, in}, faultCharger{e.charger, in})
	go func() {
		defer close(g.done)
		g.res, g.err = svc.Process(context.Background(), ev)
		once.Do(func() { close(g.reached) })
	}()
	return g
}

// waitReached waits until g pauses or finishes, or, when it waits in
// Postgres on the other event's lock, for a moment.
func (g *gated) waitReached() {
	select {
	case <-g.reached:
	case <-time.After(300 * time.Millisecond):
	}
}

func interleave(t *testing.T, e *env, kind billerKind, order int64, i, j int) {
	first, second := event(order, 999), event(order, 999)
	a := startGated(e, t, kind, first, i)
	a.waitReached()
	b := startGated(e, t, kind, second, j)
	b.waitReached()
	close(a.release)
	select { // the first may wait in Postgres on a lock the paused second holds
	case <-a.done:
	case <-time.After(300 * time.Millisecond):
	}
	close(b.release)
	<-a.done
	<-b.done
	// Whatever was Busy waits and tries again, as the pipeline does.
	ctx := context.Background()
	svc := e.biller(t, kind, e.pool, e.charger)
	outcomes := map[billing.Outcome]int{}
	for _, g := range []struct {
		ev  events.OrderConfirmed
		res billing.Result
		err error
	}{{first, a.res, a.err}, {second, b.res, b.err}} {
		res, err := g.res, g.err
		if err != nil {
			if !fault.Is(err, fault.Busy) {
				t.Fatalf("order %d event %s: %v; want an outcome or busy", order, g.ev.EventID, err)
			}
			if res, err = settle(ctx, t, svc, g.ev); err != nil {
				t.Fatalf("order %d event %s after waiting: %v", order, g.ev.EventID, err)
			}
		}
		outcomes[res.Outcome]++
	}
	if outcomes[billing.Charged] != 1 || outcomes[billing.DuplicateOrder] != 1 {
		t.Fatalf("outcomes %v; want one charged, one duplicate_order", outcomes)
	}
	if n := e.sim.ChargesFor(order); n != 1 {
		t.Fatalf("provider took %d charges for order %d, want 1", n, order)
	}
	e.settleCompanions(t)
}

// completePass runs one completer pass after the unsettled claims have
// aged by age.
func (e *env) completePass(t *testing.T, age time.Duration) billing.PassReport {
	t.Helper()
	e.age(t, age)
	c := &billing.Completer{Sessions: postgres.NewSessions(postgres.FromPool(e.pool)), Charger: e.charger, After: time.Minute, BlockAfter: time.Hour,
		Now: func() time.Time { return now }, Logger: discard()}
	rep, err := c.RunOnce(context.Background(), billing.PassOptions{})
	if err != nil {
		t.Fatalf("completer pass: %v", err)
	}
	return rep
}

// assertChargedOnce checks SPEC §9 for ev's order: one charge at the
// provider, one ledger row, charged, with that charge's id, and nothing
// pending anywhere.
func (e *env) assertChargedOnce(t *testing.T, ev events.OrderConfirmed) {
	t.Helper()
	e.settleCompanions(t)
	if n := e.sim.ChargesFor(ev.OrderID); n != 1 {
		t.Fatalf("provider took %d charges for order %d, want 1", n, ev.OrderID)
	}
	var providerID string
	for _, c := range e.sim.Charges() {
		if c.OrderID == ev.OrderID {
			providerID = c.ChargeID
		}
	}
	n, id := e.ledger(t, ev.OrderID)
	if st := e.status(t, ev.OrderID); n != 1 || st != "charged" || id != providerID {
		t.Fatalf("ledger: %d rows, status %q, charge id %q; want 1, charged, %q", n, st, id, providerID)
	}
	var pending int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM charge WHERE status <> 'charged'").Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("unsettled claims = %d, %v; want 0", pending, err)
	}
}

// The steps of a redelivery whose first attempt left its claim pending
// (a 5xx: nothing taken): the claim finds the event's own row, the send is
// recorded (committed) before the charge transaction begins, and the
// transaction holds the claim before sending.
var redeliverySteps = []string{"claim", "ledger lookup", "mark sent", "begin", "dedup insert", "claim hold", "charge", "record", "commit"}

// TestCrashAtEveryStepOfARedelivery is TestCrashAtEveryStep for the
// redelivery of an event with a pending claim: every step of its run,
// the record of the send included, failed before and after, as a lost connection
// and as a crash, then a distinct event for the order, the completer and
// the redeliveries; the order is charged once.
func TestCrashAtEveryStepOfARedelivery(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		t.Run("steps", func(t *testing.T) {
			ev := event(8300, 100)
			e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
			in := newInjector()
			svc := e.biller(t, k, faultDB{e.pool, in}, faultCharger{e.charger, in})
			if res, err := svc.Process(context.Background(), ev); err != nil || res.Outcome != billing.Charged {
				t.Fatalf("clean redelivery: %+v, %v", res, err)
			}
			if got := in.trace(); !slices.Equal(got, redeliverySteps) {
				t.Fatalf("redelivery steps = %q, want %q", got, redeliverySteps)
			}
		})
		order := int64(8300)
		for n, step := range redeliverySteps {
			for _, after := range []bool{false, true} {
				for _, mode := range []faultMode{connLost, crash} {
					order++
					t.Run(fmt.Sprintf("%s/%s/after=%v", step, mode, after), func(t *testing.T) {
						ev := event(order, 4321)
						e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
						in := newInjector()
						in.failAt, in.after, in.mode = n, after, mode
						svc := e.biller(t, k, faultDB{e.pool, in}, faultCharger{e.charger, in})
						ctx := context.Background()
						res, err := svc.Process(ctx, ev)
						t.Logf("faulty run: %+v, %v (ops %q)", res, err, in.trace())
						if mode == connLost && err != nil {
							if _, err := settle(ctx, t, svc, ev); err != nil && !fault.Is(err, fault.Transient) && !fault.Is(err, fault.Systemic) {
								t.Fatalf("retry after the cut: %v", err)
							}
						}
						fresh := e.biller(t, k, e.pool, e.charger)
						other := event(order, 4321)
						ores, oerr := fresh.Process(ctx, other)
						t.Logf("other event meanwhile: %+v, %v", ores, oerr)
						e.completePass(t, 2*time.Minute)
						if res, err = settle(ctx, t, fresh, ev); err != nil || (res.Outcome != billing.Charged && res.Outcome != billing.Duplicate) {
							t.Fatalf("redelivery: %+v, %v; want charged or duplicate", res, err)
						}
						if ores, oerr = settle(ctx, t, fresh, other); oerr != nil || ores.Outcome != billing.DuplicateOrder {
							t.Fatalf("the other event: %+v, %v; want duplicate_order", ores, oerr)
						}
						e.assertChargedOnce(t, ev)
					})
				}
			}
		}
	})
}
