package billing_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/paysim"
	"github.com/billing-consumer/billing-consumer/internal/pipeline"
)

// recordOf is the Kafka record of ev as billing keeps it, with a header.
func recordOf(ev events.OrderConfirmed) billing.Record {
	return billing.Record{Topic: "order-service.order.confirmed", Partition: 3, Offset: 77, Key: fmt.Appendf(nil, "%d", ev.OrderID),
		Value: eventJSON(ev), Headers: []billing.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}},
		Time: now.Truncate(time.Millisecond)}
}

// eventJSON is ev as order-service publishes it.
func eventJSON(ev events.OrderConfirmed) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"event_type":"order.confirmed.v1","occurred_at":%q,"order_id":%d,"customer_id":%d,"total_amount":%q}`,
		ev.EventID.String(), ev.OccurredAt.UTC().Format(time.RFC3339Nano), ev.OrderID, ev.CustomerID, ev.TotalAmount.String())
}

func (e *env) deferredRows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM deferred_event").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// expireLeases makes every deferred event due now, as the end of a crashed
// replica's lease (or of a retry's backoff) does.
func (e *env) expireLeases(t *testing.T) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), "UPDATE deferred_event SET next_try_at = now()"); err != nil {
		t.Fatal(err)
	}
}

// Defer stores an event only while another event's claim on its order is
// pending, answers true again for a redelivery of the same bytes (one row),
// and false for other bytes under the event's id (their decision is made by
// the ledger, later). TakeDeferred hands a row out only once that claim is
// no longer pending, with the record as it was consumed, and leases it:
// a second take gets nothing until the lease ends.
func TestDeferStoresTheWaitingEvent(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	a := event(9800, 2500)
	if ok, err := e.svc.Defer(ctx, a, recordOf(a)); err != nil || ok {
		t.Fatalf("Defer without another claim = %v, %v; want false", ok, err)
	}
	e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
	if ok, err := e.svc.Defer(ctx, a, recordOf(a)); err != nil || ok {
		t.Fatalf("Defer of the claim's own event = %v, %v; want false", ok, err)
	}
	b := event(9800, 2500)
	if _, err := e.svc.Process(ctx, b); !fault.Is(err, fault.Busy) {
		t.Fatalf("the second event: %v; want busy", err)
	}
	rec := recordOf(b)
	for i := range 2 {
		if ok, err := e.svc.Defer(ctx, b, rec); err != nil || !ok {
			t.Fatalf("Defer #%d = %v, %v; want true", i+1, ok, err)
		}
	}
	other := rec
	other.Value = append(bytes.Clone(rec.Value), ' ')
	if ok, err := e.svc.Defer(ctx, b, other); err != nil || ok {
		t.Fatalf("Defer of other bytes under the same event id = %v, %v; want false", ok, err)
	}
	if n := e.deferredRows(t); n != 1 {
		t.Fatalf("%d deferred rows; want 1", n)
	}
	if due, err := e.svc.TakeDeferred(ctx, 10, time.Minute); err != nil || len(due) != 0 {
		t.Fatalf("take while the claim is pending = %+v, %v; want nothing", due, err)
	}
	e.completePass(t, 2*time.Minute) // the claim is charged
	due, err := e.svc.TakeDeferred(ctx, 10, time.Minute)
	if err != nil || len(due) != 1 {
		t.Fatalf("take after the claim settled = %+v, %v; want the event", due, err)
	}
	d := due[0]
	got := d.Record
	if d.EventID != b.EventID || d.OrderID != b.OrderID || d.WaitsFor != a.EventID || d.Attempts != 1 ||
		got.Topic != rec.Topic || got.Partition != rec.Partition || got.Offset != rec.Offset || !bytes.Equal(got.Key, rec.Key) ||
		!bytes.Equal(got.Value, rec.Value) || len(got.Headers) != 1 || got.Headers[0].Key != rec.Headers[0].Key ||
		!bytes.Equal(got.Headers[0].Value, rec.Headers[0].Value) || !got.Time.Equal(rec.Time) {
		t.Fatalf("taken %+v; want the deferred record %+v", d, rec)
	}
	if again, err := e.svc.TakeDeferred(ctx, 10, time.Minute); err != nil || len(again) != 0 {
		t.Fatalf("second take within the lease = %+v, %v; want nothing", again, err)
	}
	if err := e.svc.RetryDeferred(ctx, d, 0, fmt.Errorf("test")); err != nil {
		t.Fatal(err)
	}
	if again, err := e.svc.TakeDeferred(ctx, 10, time.Minute); err != nil || len(again) != 1 || again[0].Attempts != 2 {
		t.Fatalf("take after a retry without delay = %+v, %v; want the event, attempt 2", again, err)
	}
	if err := e.svc.FinishDeferred(ctx, d); err != nil || e.deferredRows(t) != 0 {
		t.Fatalf("finish: %v, %d rows left", err, e.deferredRows(t))
	}
}

// dlqRecorder is a pipeline.DeadLetterer that keeps what it is sent; it
// fails once the injector's process has crashed.
type dlqRecorder struct {
	in   *injector
	mu   sync.Mutex
	sent []kafka.Message
	why  []dlq.Reason
}

func (d *dlqRecorder) Send(_ context.Context, msg kafka.Message, reason dlq.Reason, _ error, _ int) error {
	if d.in != nil && d.in.dead() {
		return errInjected
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent, d.why = append(d.sent, msg), append(d.why, reason)
	return nil
}

// deciderOf is a pipeline handler over svc, as the service builds it, and
// its dead-letter recorder.
func deciderOf(t *testing.T, svc *billing.Service, dl *dlqRecorder) *pipeline.Handler {
	t.Helper()
	h, err := pipeline.New(pipeline.Config{Biller: svc, DLQ: dl, Metrics: metrics.New(prometheus.NewRegistry(), "test", "test"),
		Logger: discard(), Now: time.Now, MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		ParkAfter: 30 * time.Second, Parker: svc, Deferrer: svc})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// How the claim a deferred event waits on settles.
type settlement string

const (
	byCharge  settlement = "charged"  // the waiting event is a duplicate_order
	byRelease settlement = "released" // the waiting event is charged itself
	byBlock   settlement = "blocked"  // the waiting event is a conflict
)

// deferBehind makes a's claim pending and b, a distinct event for its
// order, deferred behind it; then it settles a's claim as s says.
func (e *env) deferBehind(t *testing.T, a, b events.OrderConfirmed, s settlement) {
	t.Helper()
	ctx := context.Background()
	if s != byRelease {
		e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
		if ok, err := e.svc.Defer(ctx, b, recordOf(b)); err != nil || !ok {
			t.Fatalf("Defer = %v, %v; want true", ok, err)
		}
		if s == byCharge {
			e.completePass(t, 2*time.Minute)
		} else {
			e.completePass(t, 2*time.Hour)
		}
		return
	}
	// a's own attempt is refused while b is deferred: the claim is
	// released (a's attempt made it, nothing else was sent).
	gate := make(chan struct{})
	svc := newService(t, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		<-gate
		return e.charger.Charge(ctx, ch)
	}))
	done := make(chan error, 1)
	go func() { _, err := svc.Process(ctx, a); done <- err }()
	for deadline := time.Now().Add(10 * time.Second); e.status(t, a.OrderID) != "pending"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a's claim never appeared")
		}
	}
	if ok, err := e.svc.Defer(ctx, b, recordOf(b)); err != nil || !ok {
		t.Fatalf("Defer = %v, %v; want true", ok, err)
	}
	e.sim.SetFaults(paysim.Faults{Decline: func(o int64) bool { return o == a.OrderID }})
	close(gate)
	if err := <-done; !fault.Is(err, fault.Permanent) {
		t.Fatalf("a's refused charge: %v; want permanent", err)
	}
	e.sim.SetFaults(paysim.Faults{})
	if n, _ := e.ledger(t, a.OrderID); n != 0 {
		t.Fatalf("a's claim not released: %d rows", n)
	}
}

// assertDecided checks the order after b's decision: no deferred row is
// left, and the provider, the ledger and the DLQ hold what s implies.
func (e *env) assertDecided(t *testing.T, a, b events.OrderConfirmed, s settlement, dl *dlqRecorder) {
	t.Helper()
	if n := e.deferredRows(t); n != 0 {
		t.Fatalf("%d deferred rows left; want none", n)
	}
	dl.mu.Lock()
	sent := append([]kafka.Message(nil), dl.sent...)
	why := append([]dlq.Reason(nil), dl.why...)
	dl.mu.Unlock()
	switch s {
	case byCharge:
		e.assertChargedOnce(t, a)
	case byRelease:
		e.assertChargedOnce(t, b)
	case byBlock:
		if n := e.sim.ChargesFor(a.OrderID); n != 0 || e.status(t, a.OrderID) != "blocked" {
			t.Fatalf("%d charges, status %q; want none, blocked", n, e.status(t, a.OrderID))
		}
		if len(sent) == 0 {
			t.Fatal("the waiting event was not dead-lettered")
		}
	}
	for i, m := range sent {
		if s != byBlock || why[i] != dlq.Conflict || !bytes.Equal(m.Value, eventJSON(b)) || string(m.Key) != fmt.Sprint(b.OrderID) || len(m.Headers) != 1 {
			t.Fatalf("dead-letter record %d: %s %+v; want only conflicts of the blocked case, with b's original record", i, why[i], m)
		}
	}
}

// decideAll runs deciding passes of h, ending leases between them, until
// no deferred event is left; bounded.
func (e *env) decideAll(t *testing.T, h *pipeline.Handler) {
	t.Helper()
	for range 20 {
		if e.deferredRows(t) == 0 {
			return
		}
		e.expireLeases(t)
		if err := h.DecideDeferred(context.Background()); err != nil {
			t.Logf("deciding pass: %v", err)
		}
	}
	t.Fatalf("%d deferred rows still undecided after 20 passes", e.deferredRows(t))
}

// A deferred event is decided once the claim it waits on settles, as SPEC
// §6 decides a redelivery: duplicate_order after a charge, its own charge
// after a release, a conflict, dead-lettered with its original record,
// after a block.
func TestDeferredEventIsDecidedWhenTheClaimSettles(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(9810)
	for _, s := range []settlement{byCharge, byRelease, byBlock} {
		order++
		t.Run(string(s), func(t *testing.T) {
			a, b := event(order, 1500), event(order, 1500)
			e.deferBehind(t, a, b, s)
			dl := &dlqRecorder{}
			e.decideAll(t, deciderOf(t, e.svc, dl))
			e.assertDecided(t, a, b, s, dl)
			e.clearBlocked(t)
		})
	}
}

// clearBlocked deletes the blocked claims a case left on purpose, so the
// next case's checks see only its own.
func (e *env) clearBlocked(t *testing.T) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), "DELETE FROM charge WHERE status = 'blocked'"); err != nil {
		t.Fatal(err)
	}
}

// The deferral itself, failed before and after it takes effect, as a lost
// connection and as a crash, for each way the claim then settles: whatever
// the pipeline believed (deferred and committed, or not and still
// waiting: the record is redelivered), the deciding loop and the
// redelivery together decide the event once — the order charged once, no
// deferred row left, a conflict dead-lettered with the original record.
func TestCrashAroundTheDeferral(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(9830)
	for _, s := range []settlement{byCharge, byBlock} {
		for _, after := range []bool{false, true} {
			for _, mode := range []faultMode{connLost, crash} {
				order++
				t.Run(fmt.Sprintf("%s/%s/after=%v", s, mode, after), func(t *testing.T) {
					a, b := event(order, 900), event(order, 900)
					e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
					in := newInjector()
					in.failAt, in.after, in.mode = 0, after, mode
					deferred, err := newService(t, faultDB{e.pool, in}, e.charger).Defer(context.Background(), b, recordOf(b))
					t.Logf("defer: %v, %v (ops %q)", deferred, err, in.trace())
					if deferred && err != nil {
						t.Fatalf("defer says both deferred and %v", err)
					}
					e.completePass(t, map[settlement]time.Duration{byCharge: 2 * time.Minute, byBlock: 2 * time.Hour}[s])
					dl := &dlqRecorder{}
					e.decideAll(t, deciderOf(t, e.svc, dl))
					if !deferred {
						// The record was not committed: its redelivery decides it.
						res, err := settle(context.Background(), t, e.svc, b)
						switch {
						case s == byCharge && (err != nil || res.Outcome != billing.DuplicateOrder && res.Outcome != billing.Duplicate):
							t.Fatalf("redelivery: %+v, %v; want duplicate_order", res, err)
						case s == byBlock && !fault.Is(err, fault.Conflict):
							t.Fatalf("redelivery: %+v, %v; want a conflict", res, err)
						case s == byBlock: // the pipeline dead-letters the redelivered record
							r := recordOf(b)
							_ = dl.Send(context.Background(), kafka.Message{Key: r.Key, Value: r.Value, Headers: []kafka.Header{{Key: r.Headers[0].Key, Value: r.Headers[0].Value}}},
								dlq.Conflict, err, 1)
						}
					}
					e.assertDecided(t, a, b, s, dl)
					e.clearBlocked(t)
				})
			}
		}
	}
}

// TestCrashAtEveryStepOfADeferredDecision fails every step of a deferred
// event's decision — the take, each ledger step of its Process, the
// finish — before and after it takes effect, as a lost connection and as
// a crash, for each way the claim it waited on settled; then a restarted
// replica decides what is left once the lease has ended. The event is
// decided once: the order charged once, no deferred row left, and a
// dead-letter record (at least once) only for a conflict.
func TestCrashAtEveryStepOfADeferredDecision(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(9900)
	for _, s := range []settlement{byCharge, byRelease, byBlock} {
		// A clean decision, to count its steps.
		order++
		a, b := event(order, 700), event(order, 700)
		e.deferBehind(t, a, b, s)
		in := newInjector()
		dl := &dlqRecorder{in: in}
		if err := deciderOf(t, newService(t, faultDB{e.pool, in}, faultCharger{e.charger, in}), dl).DecideDeferred(context.Background()); err != nil {
			t.Fatal(err)
		}
		steps := in.trace()
		t.Logf("%s: a decision's steps %q", s, steps)
		e.assertDecided(t, a, b, s, dl)
		e.clearBlocked(t)
		for k, step := range steps {
			for _, after := range []bool{false, true} {
				for _, mode := range []faultMode{connLost, crash} {
					order++
					t.Run(fmt.Sprintf("%s/%d-%s/%s/after=%v", s, k, step, mode, after), func(t *testing.T) {
						a, b := event(order, 700), event(order, 700)
						e.deferBehind(t, a, b, s)
						in := newInjector()
						in.failAt, in.after, in.mode = k, after, mode
						dl := &dlqRecorder{in: in}
						err := deciderOf(t, newService(t, faultDB{e.pool, in}, faultCharger{e.charger, in}), dl).DecideDeferred(context.Background())
						t.Logf("faulty decision: %v (ops %q)", err, in.trace())
						healthy := &dlqRecorder{}
						e.decideAll(t, deciderOf(t, e.svc, healthy))
						healthy.sent, healthy.why = append(healthy.sent, dl.sent...), append(healthy.why, dl.why...)
						e.assertDecided(t, a, b, s, healthy)
						e.clearBlocked(t)
					})
				}
			}
		}
	}
}

// TestDeferredDecisionInterleavedWithARedelivery pauses a deferred event's
// decision before each of its steps (and after its last) while a
// redelivery of the same record (a replay, an offset reset) is processed
// to its end, then lets the decision go on, for each way the claim it
// waited on settled. The event is decided once whatever the interleaving:
// one charge for the order, no deferred row left, dead-letter records only
// for a conflict.
func TestDeferredDecisionInterleavedWithARedelivery(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(9990)
	for _, s := range []settlement{byCharge, byRelease, byBlock} {
		for k := range 9 {
			order++
			t.Run(fmt.Sprintf("%s/paused-before-%d", s, k), func(t *testing.T) {
				a, b := event(order, 800), event(order, 800)
				e.deferBehind(t, a, b, s)
				reached, release := make(chan struct{}), make(chan struct{})
				var once sync.Once
				in := newInjector()
				in.gate = func(n int, _ string) {
					if n == k {
						once.Do(func() { close(reached) })
						<-release
					}
				}
				dl := &dlqRecorder{}
				decided := make(chan error, 1)
				go func() {
					decided <- deciderOf(t, newService(t, faultDB{e.pool, in}, faultCharger{e.charger, in}), dl).DecideDeferred(context.Background())
					once.Do(func() { close(reached) })
				}()
				<-reached
				// The redelivery runs to its end, or until it waits in Postgres
				// on a row the paused decision's transaction holds; then the
				// decision goes on. A Busy or a lost answer is retried, as the
				// pipeline retries it.
				type answer struct {
					res billing.Result
					err error
				}
				redelivered := make(chan answer, 1)
				go func() {
					res, err := e.svc.Process(context.Background(), b)
					redelivered <- answer{res, err}
				}()
				var r answer
				select {
				case r = <-redelivered:
					close(release)
				case <-time.After(300 * time.Millisecond):
					close(release)
					r = <-redelivered
				}
				if derr := <-decided; derr != nil {
					t.Fatalf("decision: %v", derr)
				}
				res, err := r.res, r.err
				if fault.Is(err, fault.Busy) || fault.Is(err, fault.Transient) {
					res, err = settle(context.Background(), t, e.svc, b)
				}
				t.Logf("redelivery: %+v, %v (decision ops %q)", res, err, in.trace())
				if fault.Is(err, fault.Conflict) {
					r := recordOf(b)
					_ = dl.Send(context.Background(), kafka.Message{Key: r.Key, Value: r.Value, Headers: []kafka.Header{{Key: r.Headers[0].Key, Value: r.Headers[0].Value}}},
						dlq.Conflict, err, 1)
				} else if err != nil {
					t.Fatalf("redelivery: %v", err)
				}
				e.decideAll(t, deciderOf(t, e.svc, dl))
				e.assertDecided(t, a, b, s, dl)
				e.clearBlocked(t)
			})
		}
	}
}
