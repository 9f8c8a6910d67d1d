package billing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// A parked claim is the completer's from then on: its passes over parked
// claims re-send it long before BILLING_COMPLETER_AFTER, on a backoff from
// a second (the database's clock), and settle it once the provider
// answers; the counts say how many are parked meanwhile. Park keeps the
// event's record (a deferred row waiting on its own claim), counted once,
// and decided as a duplicate once the completer has charged the claim.
// Park answers false for an event without a pending claim.
func TestParkedClaimIsResentPromptly(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	if ok, err := e.svc.Park(ctx, event(9400, 100), recordOf(event(9400, 100))); err != nil || ok {
		t.Fatalf("Park without a claim = %v, %v; want false", ok, err)
	}
	ev := event(9401, 2500)
	e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1}) // 5xx: nothing taken, the claim pending
	if ok, err := e.svc.Park(ctx, ev, recordOf(ev)); err != nil || !ok {
		t.Fatalf("Park = %v, %v; want true", ok, err)
	}
	// The completer's clock says the claim is fresh (well below After):
	// only its parked-claim passes may send it.
	c := e.completer(t, e.charger, 0)
	pass := func() billing.PassReport {
		t.Helper()
		rep, err := c.RunOnce(ctx, billing.PassOptions{ParkedOnly: true})
		if err != nil {
			t.Fatalf("parked pass: %v", err)
		}
		return rep
	}
	// The parked event's record is kept (a row waiting on its own claim),
	// counted once: as parked, not also as deferred.
	if rep := pass(); len(rep.Settled) != 0 || rep.Unsettled.Parked != 1 || rep.Unsettled.Deferred != 0 || e.deferredRows(t) != 1 {
		t.Fatalf("pass right after parking: %+v, %d deferred rows; want nothing due yet, 1 parked, 0 deferred, its record kept",
			rep, e.deferredRows(t))
	}
	e.sim.SetFaults(paysim.Faults{ErrorRate: 1})
	resent := waitSettled(t, pass, "pending")
	t.Logf("re-sent while failing: %+v", resent)
	e.sim.SetFaults(paysim.Faults{})
	settled := waitSettled(t, pass, "charged")
	t.Logf("settled: %+v", settled)
	if rep := pass(); rep.Unsettled.Parked != 0 || rep.Unsettled.Pending != 0 {
		t.Fatalf("after the charge: %+v; want nothing parked or pending", rep.Unsettled)
	}
	e.assertChargedOnce(t, ev)
	// The charged parked claim's record is decided as a duplicate of it,
	// and its row deleted: rows do not pile up.
	dl := &dlqRecorder{}
	e.decideAll(t, deciderOf(t, e.svc, dl))
	if len(dl.why) != 0 || e.sim.ChargesFor(ev.OrderID) != 1 {
		t.Fatalf("dead letters %v, %d charges; want none, 1", dl.why, e.sim.ChargesFor(ev.OrderID))
	}
}

// waitSettled runs pass until it settles a claim with result want; bounded.
func waitSettled(t *testing.T, pass func() billing.PassReport, want string) billing.Settled {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, s := range pass().Settled {
			if s.Result == want {
				return s
			}
		}
	}
	t.Fatalf("no parked claim settled as %s within 20 s", want)
	return billing.Settled{}
}

// The park, failed before and after it takes effect, as a lost connection
// and as a crash: whatever the pipeline then believes (parked, or not and
// retrying), a distinct event for the order stays out, the completer and
// the event's redelivery settle the claim, and the order is charged once.
func TestCrashAroundThePark(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(9600)
	for _, after := range []bool{false, true} {
		for _, mode := range []faultMode{connLost, crash} {
			order++
			t.Run(fmt.Sprintf("%s/after=%v", mode, after), func(t *testing.T) {
				ev := event(order, 1200)
				e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
				in := newInjector()
				in.failAt, in.after, in.mode = 0, after, mode
				svc := newService(t, faultDB{e.pool, in}, e.charger)
				parked, err := svc.Park(context.Background(), ev, recordOf(ev))
				t.Logf("park: %v, %v (ops %q)", parked, err, in.trace())
				if parked && err != nil {
					t.Fatalf("park says both parked and %v", err)
				}
				other := event(order, 1200)
				if res, err := e.svc.Process(context.Background(), other); err == nil || res.Outcome == billing.Charged {
					t.Fatalf("a distinct event meanwhile: %+v, %v; want it busy", res, err)
				}
				e.completePass(t, 2*time.Minute)
				if res, err := settle(context.Background(), t, e.svc, ev); err != nil || (res.Outcome != billing.Charged && res.Outcome != billing.Duplicate) {
					t.Fatalf("redelivery: %+v, %v; want charged or duplicate", res, err)
				}
				if res, err := settle(context.Background(), t, e.svc, other); err != nil || res.Outcome != billing.DuplicateOrder {
					t.Fatalf("the distinct event: %+v, %v; want duplicate_order", res, err)
				}
				e.assertChargedOnce(t, ev)
			})
		}
	}
}

// Park matches the claim's body too: an event with the claim's event_id
// and order but another amount is a conflict (SPEC §6), not the claim's
// event, and must never be parked (its record committed) in its place.
// (The second adversarial review found Park matched only the ids.)
func TestParkMatchesTheClaimsBody(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	ev := event(9901, 2500)
	e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
	other := ev
	other.TotalAmount = 9999
	if _, err := e.svc.Process(ctx, other); !fault.Is(err, fault.Conflict) {
		t.Fatalf("Process of the other body = %v; want Conflict (the claim is not its own)", err)
	}
	ok, err := e.svc.Park(ctx, other, recordOf(other))
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Errorf("Park(event with the claim's event_id but amount %s, claim's %s) = true: its record would be committed as parked instead of dead-lettered as conflict",
			other.TotalAmount, ev.TotalAmount)
	}
}

// A delivery that parks is not necessarily the claim's creator, and from
// then on the completer sends: Park records others_sent_at, so that the
// creator, still running elsewhere (the old owner of a rebalanced
// partition) and refused by a gateway's 404, cannot release the parked
// claim and lose the event whose record was committed. (Found by the
// second adversarial review, where the creator released it.)
func TestNoReleaseOfAParkedClaim(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	gw := gatewayNotFound(t).ForBilling()
	ev := event(9903, 1000)
	in := newInjector()
	in.failAt, in.mode = 1, connLost // op 0 the claim, op 1 BEGIN
	var viaGateway bool
	a1 := newService(t, faultDB{e.pool, in}, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		if viaGateway {
			return gw.Charge(ctx, ch)
		}
		return e.charger.Charge(ctx, ch)
	}))
	attempt := billing.WithAttempt(ctx)
	if _, err := a1.Process(attempt, ev); err == nil {
		t.Fatalf("A1: no error; want the lost BEGIN (ops %q)", in.trace())
	}
	if ok, err := e.svc.Park(ctx, ev, recordOf(ev)); err != nil || !ok { // the other delivery parks; its record is committed
		t.Fatalf("Park = %v, %v", ok, err)
	}
	viaGateway = true
	_, err := a1.Process(attempt, ev)
	t.Logf("A1's retry through the gateway: %v", err)
	if st := e.status(t, ev.OrderID); st == "" {
		t.Errorf("the creator released a parked claim (its parking delivery's record already committed): the event is decided only if the creator's own delivery still dead-letters it")
	}
}

// Parking raced with the completer's parked passes, a redelivery of the
// event and a distinct event for the order, while the provider answers
// 5xx, 409 or is slow: each order is charged once, nothing deadlocks, and
// the distinct event ends duplicate_order. (The second adversarial
// review's, which held.)
func TestParkRacingTheCompleterAndARedelivery(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	const n = 12
	evs := make([]events.OrderConfirmed, n)
	for i := range evs {
		evs[i] = event(int64(9950+i), 1000)
		e.pendingClaim(t, evs[i], paysim.Faults{ErrorRate: 1})
	}
	e.sim.SetFaults(paysim.Faults{ErrorRate: 0.3, ConflictRate: 0.2, Latency: 20 * time.Millisecond, LatencyJitter: 40 * time.Millisecond})
	c := e.completer(t, e.charger, 0)
	c.ParkedBackoffMax = 50 * time.Millisecond
	bt := billing.NewBatcher(e.svc, billing.BatcherConfig{MaxBatch: 4, MaxInFlight: 2})
	defer bt.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	report := func(err error) {
		if err != nil && (errors.Is(err, context.DeadlineExceeded) || containsAny(err.Error(), "deadlock", "40P01")) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	for _, ev := range evs {
		wg.Go(func() {
			_, err := e.svc.Park(ctx, ev, recordOf(ev))
			report(err)
		})
		wg.Go(func() {
			for range 5 {
				_, err := bt.Process(billing.WithAttempt(ctx), ev)
				report(err)
			}
		})
		wg.Go(func() {
			for range 3 {
				_, err := e.svc.Process(ctx, event(ev.OrderID, 1000))
				report(err)
			}
		})
	}
	stop := make(chan struct{})
	var cw sync.WaitGroup
	cw.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, err := c.RunOnce(ctx, billing.PassOptions{ParkedOnly: true})
			report(err)
			time.Sleep(5 * time.Millisecond)
		}
	})
	wg.Wait()
	close(stop)
	cw.Wait()
	if len(errs) > 0 {
		t.Errorf("deadlocks or timeouts: %v", errs)
	}
	e.sim.SetFaults(paysim.Faults{})
	e.completePass(t, 2*time.Minute)
	for _, ev := range evs {
		if res, err := settle(ctx, t, e.svc, ev); err != nil || (res.Outcome != billing.Duplicate && res.Outcome != billing.Charged) {
			t.Errorf("order %d redelivery: %+v, %v", ev.OrderID, res, err)
		}
		if res, err := settle(ctx, t, e.svc, event(ev.OrderID, 1000)); err != nil || res.Outcome != billing.DuplicateOrder {
			t.Errorf("order %d distinct event: %+v, %v", ev.OrderID, res, err)
		}
		if got := e.sim.ChargesFor(ev.OrderID); got != 1 {
			t.Errorf("order %d: %d charges", ev.OrderID, got)
		}
		if st := e.status(t, ev.OrderID); st != "charged" {
			t.Errorf("order %d: %s", ev.OrderID, st)
		}
	}
}

// containsAny reports whether s contains any of subs.
func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// The service's passes (Completer.Passes) count the claims on every full
// pass, and on a parked pass only while the last count saw parked claims
// or deferred events: a healthy stream's unsettled claims (each in-flight
// event's) are not scanned every tick. The parked claim is counted on the
// parked passes until it has settled, then its event's kept record (a
// deferred row until the event is decided); the pass that sees neither
// counts once more, so the gauge comes back to 0, and the next does not.
func TestPassesCountParkedClaimsEveryTickOnly(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	c := e.completer(t, e.charger, 0)
	var reps []billing.PassReport
	_, run := c.Passes(time.Hour, func(rep billing.PassReport) { reps = append(reps, rep) })
	pass := func() billing.PassReport {
		t.Helper()
		if err := run(ctx); err != nil {
			t.Fatalf("pass: %v", err)
		}
		return reps[len(reps)-1]
	}
	if rep := pass(); !rep.Counted {
		t.Fatalf("the first pass (a full one) did not count: %+v", rep)
	}
	if rep := pass(); rep.Counted {
		t.Fatalf("a parked pass counted with nothing parked or deferred: %+v", rep)
	}
	ev := event(9450, 2500)
	e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
	if ok, err := e.svc.Park(ctx, ev, recordOf(ev)); err != nil || !ok {
		t.Fatalf("Park = %v, %v; want true", ok, err)
	}
	// Until the next full pass the parked claim is not counted; a
	// full pass sees it (a Passes of its own, whose first pass is full).
	_, run = c.Passes(time.Hour, func(rep billing.PassReport) { reps = append(reps, rep) })
	if rep := pass(); !rep.Counted || rep.Unsettled.Parked != 1 {
		t.Fatalf("full pass: %+v; want 1 parked counted", rep)
	}
	e.sim.SetFaults(paysim.Faults{})
	deadline := time.Now().Add(30 * time.Second)
	for {
		rep := pass()
		if !rep.Counted {
			t.Fatalf("a parked pass did not count while a claim was parked: %+v", rep)
		}
		if rep.Unsettled.Parked == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the parked claim was not settled within 30s: %+v", rep)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.assertChargedOnce(t, ev)
	if rep := pass(); !rep.Counted || rep.Unsettled.Deferred != 1 {
		t.Fatalf("pass after the charge: %+v; want the event's kept record counted as deferred", rep)
	}
	// The event decided (its row gone, as DecideDeferred leaves it).
	if _, err := e.pool.Exec(ctx, "DELETE FROM deferred_event"); err != nil {
		t.Fatal(err)
	}
	if rep := pass(); !rep.Counted || rep.Unsettled.Parked+rep.Unsettled.Deferred != 0 {
		t.Fatalf("pass after the decision: %+v; want a count of nothing waiting", rep)
	}
	if rep := pass(); rep.Counted {
		t.Fatalf("a parked pass counted with nothing parked or deferred any more: %+v", rep)
	}
}

// failingCounts fails the first n counts of its sessions' passes.
type failingCounts struct {
	billing.Sessions
	n *int
}

func (f failingCounts) Acquire(ctx context.Context) (billing.Session, error) {
	s, err := f.Sessions.Acquire(ctx)
	return failingCount{s, f.n}, err
}

type failingCount struct {
	billing.Session
	n *int
}

func (f failingCount) CountUnsettled(ctx context.Context) (billing.Unsettled, error) {
	if *f.n > 0 {
		*f.n--
		return billing.Unsettled{}, errors.New("count refused (test)")
	}
	return f.Session.CountUnsettled(ctx)
}

// A count that failed is tried again at the next tick, not at the next
// full pass: the gauges would otherwise keep a stale value for an
// interval more.
func TestPassesCountAgainAfterAFailedCount(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	c := e.completer(t, e.charger, 0)
	fails := 1
	c.Sessions = failingCounts{c.Sessions, &fails}
	var reps []billing.PassReport
	_, run := c.Passes(time.Hour, func(rep billing.PassReport) { reps = append(reps, rep) })
	if err := run(ctx); err == nil || reps[0].Counted {
		t.Fatalf("first pass: %+v, %v; want its count failed", reps[0], err)
	}
	if err := run(ctx); err != nil || !reps[1].Counted {
		t.Fatalf("the parked pass after a failed count: %+v, %v; want it counted", reps[1], err)
	}
	if err := run(ctx); err != nil || reps[2].Counted {
		t.Fatalf("the next parked pass, nothing parked or deferred: %+v, %v; want no count", reps[2], err)
	}
}
