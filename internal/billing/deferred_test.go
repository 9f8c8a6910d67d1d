package billing_test

import (
	"bytes"
	"context"
	"encoding/binary"
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
	"github.com/billing-consumer/billing-consumer/internal/pipeline"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// recordOf is the Kafka record of ev as billing keeps it, with a header;
// each event has a record of its own (its offset from its event_id).
func recordOf(ev events.OrderConfirmed) billing.Record {
	offset := int64(binary.BigEndian.Uint64(ev.EventID[8:]) >> 2)
	return billing.Record{Topic: "order-service.order.confirmed", Partition: 3, Offset: offset, Key: fmt.Appendf(nil, "%d", ev.OrderID),
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
// pending, answers true again for a redelivery of the same record (one
// row), and stores the same event in another record (a replay, other
// bytes) in a row of its own, after the first. TakeDeferred hands a row
// out only once that claim is no longer pending and no row deferred
// before it on the order is left, with the record as it was consumed, and
// leases it: a second take gets nothing until the lease ends, and the
// holder of an ended lease can neither give the row back nor finish it.
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
	if n := e.deferredRows(t); n != 1 {
		t.Fatalf("%d deferred rows after a redelivery; want 1", n)
	}
	// The same event in another record (other bytes, another offset: a
	// re-serialising producer, a replay) is deferred too, in a row of its
	// own, after the first: each is decided, the second as a duplicate.
	other := rec
	other.Offset, other.Value = rec.Offset+1, append(bytes.Clone(rec.Value), ' ')
	if ok, err := e.svc.Defer(ctx, b, other); err != nil || !ok {
		t.Fatalf("Defer of the event in another record = %v, %v; want true", ok, err)
	}
	if d, ok, err := e.svc.TakeDeferred(ctx, time.Minute); err != nil || ok {
		t.Fatalf("take while the claim is pending = %+v, %v, %v; want nothing", d, ok, err)
	}
	e.completePass(t, 2*time.Minute) // the claim is charged
	d, ok, err := e.svc.TakeDeferred(ctx, time.Minute)
	if err != nil || !ok {
		t.Fatalf("take after the claim settled = %+v, %v, %v; want the event", d, ok, err)
	}
	got := d.Record
	if d.EventID != b.EventID || d.OrderID != b.OrderID || d.WaitsFor != a.EventID || d.Attempts != 1 ||
		got.Topic != rec.Topic || got.Partition != rec.Partition || got.Offset != rec.Offset || !bytes.Equal(got.Key, rec.Key) ||
		!bytes.Equal(got.Value, rec.Value) || len(got.Headers) != 1 || got.Headers[0].Key != rec.Headers[0].Key ||
		!bytes.Equal(got.Headers[0].Value, rec.Headers[0].Value) || !got.Time.Equal(rec.Time) {
		t.Fatalf("taken %+v; want the deferred record %+v", d, rec)
	}
	if again, ok, err := e.svc.TakeDeferred(ctx, time.Minute); err != nil || ok {
		t.Fatalf("second take within the lease = %+v, %v, %v; want nothing", again, ok, err)
	}
	if err := e.svc.RetryDeferred(ctx, d, 0, fmt.Errorf("test")); err != nil {
		t.Fatal(err)
	}
	again, ok, err := e.svc.TakeDeferred(ctx, time.Minute)
	if err != nil || !ok || again.Attempts != 2 {
		t.Fatalf("take after a retry without delay = %+v, %v, %v; want the event, attempt 2", again, ok, err)
	}
	// The holder of the first lease no longer holds the row: it can neither
	// give it back nor finish it.
	if err := e.svc.FinishDeferred(ctx, d); err != nil || e.deferredRows(t) != 2 {
		t.Fatalf("finish by a stale lease: %v, %d rows left; want both rows kept", err, e.deferredRows(t))
	}
	if err := e.svc.FinishDeferred(ctx, again); err != nil || e.deferredRows(t) != 1 {
		t.Fatalf("finish: %v, %d rows left; want the second record's", err, e.deferredRows(t))
	}
	second, ok, err := e.svc.TakeDeferred(ctx, time.Minute)
	if err != nil || !ok || second.Record.Offset != other.Offset {
		t.Fatalf("take after the first row = %+v, %v, %v; want the second record", second, ok, err)
	}
	if err := e.svc.FinishDeferred(ctx, second); err != nil || e.deferredRows(t) != 0 {
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

// redeliveredConflict records the dead letter the pipeline writes for
// ev's redelivered record when it is a conflict.
func (d *dlqRecorder) redeliveredConflict(ev events.OrderConfirmed, cause error) {
	r := recordOf(ev)
	_ = d.Send(context.Background(), kafka.Message{Key: r.Key, Value: r.Value, Headers: []kafka.Header{{Key: r.Headers[0].Key, Value: r.Headers[0].Value}}},
		dlq.Conflict, cause, 1)
}

// deciderOf is a pipeline handler over svc, as the service builds it, and
// its dead-letter recorder.
func deciderOf(t *testing.T, svc *billing.Service, dl *dlqRecorder) *pipeline.Handler {
	t.Helper()
	h, err := pipeline.New(pipeline.Config{Biller: svc, DLQ: dl, Decisions: svc, Metrics: metrics.New(prometheus.NewRegistry(), "test", "test"),
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
	byCharge   settlement = "charged"  // the waiting event is a duplicate_order
	byRelease  settlement = "released" // the waiting event is charged itself
	byConflict settlement = "conflict" // charged with another amount: the waiting event is a conflict
)

// pair is the claim's event a and the event b that waits on it, for s:
// the same order, and for byConflict another amount.
func pair(order int64, s settlement) (a, b events.OrderConfirmed) {
	a, b = event(order, 1500), event(order, 1500)
	if s == byConflict {
		b.TotalAmount++
	}
	return a, b
}

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
		e.completePass(t, 2*time.Minute)
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
	case byCharge, byConflict:
		e.assertChargedOnce(t, a)
	case byRelease:
		e.assertChargedOnce(t, b)
	}
	if s == byConflict && len(sent) == 0 {
		t.Fatal("the waiting event was not dead-lettered")
	}
	for i, m := range sent {
		if s != byConflict || why[i] != dlq.Conflict || !bytes.Equal(m.Value, eventJSON(b)) || string(m.Key) != fmt.Sprint(b.OrderID) || len(m.Headers) != 1 {
			t.Fatalf("dead-letter record %d: %s %+v; want only conflicts of the conflict case, with b's original record", i, why[i], m)
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
// after a charge with another amount.
func TestDeferredEventIsDecidedWhenTheClaimSettles(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(9810)
	for _, s := range []settlement{byCharge, byRelease, byConflict} {
		order++
		t.Run(string(s), func(t *testing.T) {
			a, b := pair(order, s)
			e.deferBehind(t, a, b, s)
			dl := &dlqRecorder{}
			e.decideAll(t, deciderOf(t, e.svc, dl))
			e.assertDecided(t, a, b, s, dl)
		})
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
	for _, s := range []settlement{byCharge, byConflict} {
		for _, after := range []bool{false, true} {
			for _, mode := range []faultMode{connLost, crash} {
				order++
				t.Run(fmt.Sprintf("%s/%s/after=%v", s, mode, after), func(t *testing.T) {
					a, b := pair(order, s)
					e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
					in := newInjector()
					in.failAt, in.after, in.mode = 0, after, mode
					deferred, err := newService(t, faultDB{e.pool, in}, e.charger).Defer(context.Background(), b, recordOf(b))
					t.Logf("defer: %v, %v (ops %q)", deferred, err, in.trace())
					if deferred && err != nil {
						t.Fatalf("defer says both deferred and %v", err)
					}
					e.completePass(t, 2*time.Minute)
					dl := &dlqRecorder{}
					e.decideAll(t, deciderOf(t, e.svc, dl))
					if !deferred {
						// The record was not committed: its redelivery decides it.
						res, err := settle(context.Background(), t, e.svc, b)
						switch {
						case s == byCharge && (err != nil || res.Outcome != billing.DuplicateOrder && res.Outcome != billing.Duplicate):
							t.Fatalf("redelivery: %+v, %v; want duplicate_order", res, err)
						case s == byConflict && !fault.Is(err, fault.Conflict):
							t.Fatalf("redelivery: %+v, %v; want a conflict", res, err)
						case s == byConflict: // the pipeline dead-letters the redelivered record
							dl.redeliveredConflict(b, err)
						}
					}
					e.assertDecided(t, a, b, s, dl)
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
	for _, s := range []settlement{byCharge, byRelease, byConflict} {
		// A clean decision, to count its steps.
		order++
		a, b := pair(order, s)
		e.deferBehind(t, a, b, s)
		in := newInjector()
		dl := &dlqRecorder{in: in}
		if err := deciderOf(t, newService(t, faultDB{e.pool, in}, faultCharger{e.charger, in}), dl).DecideDeferred(context.Background()); err != nil {
			t.Fatal(err)
		}
		steps := in.trace()
		t.Logf("%s: a decision's steps %q", s, steps)
		e.assertDecided(t, a, b, s, dl)
		for k, step := range steps {
			for _, after := range []bool{false, true} {
				for _, mode := range []faultMode{connLost, crash} {
					order++
					t.Run(fmt.Sprintf("%s/%d-%s/%s/after=%v", s, k, step, mode, after), func(t *testing.T) {
						a, b := pair(order, s)
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
	for _, s := range []settlement{byCharge, byRelease, byConflict} {
		for k := range 9 {
			order++
			t.Run(fmt.Sprintf("%s/paused-before-%d", s, k), func(t *testing.T) {
				a, b := pair(order, s)
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
					dl.redeliveredConflict(b, err)
				} else if err != nil {
					t.Fatalf("redelivery: %v", err)
				}
				e.decideAll(t, deciderOf(t, e.svc, dl))
				e.assertDecided(t, a, b, s, dl)
			})
		}
	}
}

// A deferred event holds its order against the events after it (SPEC §10:
// order matters within one order): once the claim it waited on is
// released, a later event of the order — here the next record of the
// same key, with another amount, consumed after the deferred record was
// committed — may not claim the order first. It waits (Busy), is deferred
// behind the first, and is decided after it: the first charged, the later
// one a conflict. (The review of the first version found the later event
// charging its amount and the earlier one dead-lettered.)
func TestALaterEventWaitsBehindADeferredOne(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	order := int64(77001)
	a, b := pair(order, byRelease)
	e.deferBehind(t, a, b, byRelease) // b deferred, a's claim released
	c := event(order, 2500)
	if res, err := e.svc.Process(ctx, c); !fault.Is(err, fault.Busy) {
		t.Fatalf("the later event while the deferred one is undecided: %+v, %v; want busy", res, err)
	}
	if ok, err := e.svc.Defer(ctx, c, recordOf(c)); err != nil || !ok {
		t.Fatalf("Defer of the later event = %v, %v; want true (held by the deferred one)", ok, err)
	}
	dl := &dlqRecorder{}
	e.decideAll(t, deciderOf(t, e.svc, dl))
	e.assertChargedOnce(t, b)
	if len(dl.why) != 1 || dl.why[0] != dlq.Conflict || !bytes.Equal(dl.sent[0].Value, eventJSON(c)) {
		t.Fatalf("dead letters %v; want the later event's conflict", dl.why)
	}
}

// A deferred event behind a claim that becomes blocked is not decided
// until an operator decides the claim (a blocked claim is unsettled):
// after `claim release` it charges the order itself, after `claim
// mark-charged` it is a duplicate_order. (The review of the first version
// found it dead-lettered as a conflict at once, so that after the
// release nothing charged the order.)
func TestADeferredEventBehindABlockedClaimWaitsForTheOperator(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	order := int64(77010)
	for _, action := range []billing.OperatorAction{billing.ActionRelease, billing.ActionMarkCharged} {
		order++
		t.Run(string(action), func(t *testing.T) {
			a, b := pair(order, byCharge)
			e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
			if ok, err := e.svc.Defer(ctx, b, recordOf(b)); err != nil || !ok {
				t.Fatalf("Defer = %v, %v; want true", ok, err)
			}
			e.completePass(t, 2*time.Hour) // blocked: past block-after
			dl := &dlqRecorder{}
			h := deciderOf(t, e.svc, dl)
			e.expireLeases(t)
			if err := h.DecideDeferred(ctx); err != nil {
				t.Fatal(err)
			}
			if e.status(t, order) != "blocked" || e.deferredRows(t) != 1 || len(dl.why) != 0 {
				t.Fatalf("before the operator: claim %q, %d deferred rows, dead letters %v; want blocked, 1, none", e.status(t, order), e.deferredRows(t), dl.why)
			}
			e.inFlightOver(t, order) // the operator waits for decide_after (SPEC §11 I5)
			req := billing.OperatorRequest{OrderID: order, Action: action, Operator: "test", Reason: "provider checked",
				ProviderHoldsNoCharge: action == billing.ActionRelease, ChargeID: map[bool]string{true: "ch_by_operator"}[action == billing.ActionMarkCharged]}
			if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(e.pool), discard(), req); err != nil {
				t.Fatal(err)
			}
			e.decideAll(t, h)
			if action == billing.ActionRelease {
				e.assertChargedOnce(t, b)
			} else if n := e.sim.ChargesFor(order); n != 0 || e.status(t, order) != "charged" {
				t.Fatalf("after mark-charged: %d charges, claim %q; want none (a duplicate_order), charged", n, e.status(t, order))
			}
			if len(dl.why) != 0 {
				t.Fatalf("dead letters %v; want none", dl.why)
			}
		})
	}
}

// shortLease is a replica's Deferrer with the lease scaled down from the
// service's minute, as is the time a decision takes.
type shortLease struct {
	*billing.Service
	lease time.Duration
}

func (s shortLease) TakeDeferred(ctx context.Context, _ time.Duration) (billing.Deferred, bool, error) {
	return s.Service.TakeDeferred(ctx, s.lease)
}

// A lease covers one decision: a pass that decides several deferred
// events one after another never decides one whose lease has run out
// while another replica decides it too (scaled: lease 1 s, 700 ms a
// decision, two refused events). Each refused event's claim is then
// released by the one decision that made it, and dead-lettered once.
// (The review of the first version found a pass leasing all its rows at
// once: the second was decided by both replicas, and its claim, sent by
// two attempts, could no longer be released.)
func TestEachDecisionHasItsOwnLease(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	o1, o2 := int64(77021), int64(77022)
	a1, b1 := pair(o1, byRelease)
	a2, b2 := pair(o2, byRelease)
	e.deferBehind(t, a1, b1, byRelease)
	e.deferBehind(t, a2, b2, byRelease)
	e.sim.SetFaults(paysim.Faults{Decline: func(o int64) bool { return o == o1 || o == o2 }})
	defer e.sim.SetFaults(paysim.Faults{})
	slow := chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		time.Sleep(700 * time.Millisecond)
		return e.charger.Charge(ctx, ch)
	})
	replica := func(dl *dlqRecorder) *pipeline.Handler {
		svc := newService(t, e.pool, slow)
		h, err := pipeline.New(pipeline.Config{Biller: svc, DLQ: dl, Decisions: svc, Metrics: metrics.New(prometheus.NewRegistry(), "test", "test"),
			Logger: discard(), Now: time.Now, MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond,
			ParkAfter: 30 * time.Second, Parker: svc, Deferrer: shortLease{svc, time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	dl1, dl2 := &dlqRecorder{}, &dlqRecorder{}
	r1, r2 := replica(dl1), replica(dl2)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r1.DecideDeferred(ctx) })
	wg.Go(func() { time.Sleep(1100 * time.Millisecond); _ = r2.DecideDeferred(ctx) })
	wg.Wait()
	for _, o := range []int64{o1, o2} {
		if n, _ := e.ledger(t, o); n != 0 {
			t.Errorf("order %d: its refused claim is %q; want it released by the decision that made it", o, e.status(t, o))
		}
	}
	if n := len(dl1.why) + len(dl2.why); n != 2 || e.deferredRows(t) != 0 {
		t.Fatalf("%d dead letters, %d rows left; want 2 (one per event), none", n, e.deferredRows(t))
	}
}

// Another event deferred at a deferred record's place (a topic deleted and
// recreated under its name reuses offsets) is stored in a row of its own,
// never taken for the record already there. (The second review found
// Defer answering "stored" for it while nothing was: the event lost.)
func TestDeferOfAnotherEventAtTheSamePlace(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	a, b := pair(77031, byCharge)
	e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
	if ok, err := e.svc.Defer(ctx, b, recordOf(b)); err != nil || !ok {
		t.Fatalf("Defer = %v, %v; want true", ok, err)
	}
	c := event(77031, 1500)
	rec := recordOf(c)
	rec.Offset = recordOf(b).Offset
	if ok, err := e.svc.Defer(ctx, c, rec); err != nil || !ok {
		t.Fatalf("Defer of another event at b's place = %v, %v; want true", ok, err)
	}
	var rows int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM deferred_event WHERE event_id = $1", [16]byte(c.EventID)).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("rows of the other event: %d, %v; want 1", rows, err)
	}
	e.completePass(t, 2*time.Minute)
	e.decideAll(t, deciderOf(t, e.svc, &dlqRecorder{}))
	e.assertChargedOnce(t, a)
}
