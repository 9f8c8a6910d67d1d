package billing_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/pipeline"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// Tests of SPEC §11 I2 and I3 around blocked claims: an event behind a
// blocked claim — another event's or its own — is held (billing.ErrHeld,
// a Busy), deferred and decided with the claim after the operator's
// decision, never dead-lettered as a conflict at once; a parked event
// keeps its record, so that the provider's definite refusal of its
// re-send ends, after `claim release`, in a `permanent` dead letter of the
// original record rather than nowhere.

// isHeld reports whether err is the held answer: Busy, with ErrHeld.
func isHeld(err error) bool { return fault.Is(err, fault.Busy) && errors.Is(err, billing.ErrHeld) }

// messageOf is the Kafka record of billing's copy r.
func messageOf(r billing.Record) kafka.Message {
	m := kafka.Message{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Time: r.Time}
	for _, hd := range r.Headers {
		m.Headers = append(m.Headers, kafka.Header{Key: hd.Key, Value: hd.Value})
	}
	return m
}

// handle runs ev's record through h as the consumer would, bounded: a
// record still waiting after 10 s fails the test.
func handle(t *testing.T, h *pipeline.Handler, ev events.OrderConfirmed) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Handle(ctx, messageOf(recordOf(ev))); err != nil {
		t.Fatalf("the record of event %s is not committable: %v", ev.EventID, err)
	}
}

// blockedClaim leaves ev's order claimed by ev, blocked: its charge's
// outcome stayed unknown past block-after (the provider took nothing).
func (e *env) blockedClaim(t *testing.T, ev events.OrderConfirmed, park bool) {
	t.Helper()
	e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
	if park {
		if ok, err := e.svc.Park(context.Background(), ev, recordOf(ev)); err != nil || !ok {
			t.Fatalf("Park = %v, %v; want true", ok, err)
		}
	}
	e.completePass(t, 2*time.Hour)
	if st := e.status(t, ev.OrderID); st != "blocked" {
		t.Fatalf("claim %q; want blocked", st)
	}
}

// operator applies action to order's claim as `claim release` (the
// provider holds nothing) or `claim mark-charged` do, once the runbook's
// wait for the requests in flight is over (SPEC §11 I5).
func (e *env) operator(t *testing.T, order int64, action billing.OperatorAction) {
	t.Helper()
	e.inFlightOver(t, order)
	req := billing.OperatorRequest{OrderID: order, Action: action, Operator: "test", Reason: "provider checked",
		ProviderHoldsNoCharge: action == billing.ActionRelease}
	if action == billing.ActionMarkCharged {
		req.ChargeID = "ch_by_operator"
	}
	if _, err := billing.ApplyOperator(context.Background(), postgres.NewStoreOn(e.pool), discard(), req); err != nil {
		t.Fatal(err)
	}
}

// assertNoDeadLetters fails when dl holds a record.
func assertNoDeadLetters(t *testing.T, dl *dlqRecorder, when string) {
	t.Helper()
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if len(dl.why) != 0 {
		t.Fatalf("%s: dead letters %v; want none", when, dl.why)
	}
}

// Defect 2 of issue 29, on both billers: an event for an order whose claim
// (another event's) is blocked is held — with the claim's amount or
// another, since the operator's decision says which it is — not a
// conflict; the claim is left as it is. An event with the claim's
// event_id and another body stays a conflict at once.
func TestAnEventBehindAnotherBlockedClaimIsHeld(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		a := event(77201, 1500)
		e.blockedClaim(t, a, false)
		svc := e.biller(t, k, e.pool, e.charger)
		for _, b := range []events.OrderConfirmed{event(a.OrderID, 1500), event(a.OrderID, 1600)} {
			if res, err := svc.Process(context.Background(), b); !isHeld(err) {
				t.Fatalf("event for the blocked order (amount %s): %+v, %v; want held (busy, ErrHeld)", b.TotalAmount, res, err)
			}
		}
		forged := a
		forged.TotalAmount++
		if _, err := svc.Process(context.Background(), forged); !fault.Is(err, fault.Conflict) {
			t.Fatalf("the claim's event_id with another amount: %v; want conflict", err)
		}
		if st := e.status(t, a.OrderID); st != "blocked" || e.sim.ChargesFor(a.OrderID) != 0 {
			t.Fatalf("claim %q, %d charges; want blocked, none", st, e.sim.ChargesFor(a.OrderID))
		}
		e.settleCompanions(t)
	})
}

// Defect 2 at the record: a's claim is parked, then blocked; b, a distinct
// event for the order with the same amount, is deferred (its record
// committable at once), not dead-lettered. After `claim release` (the
// provider holds nothing for a's key) the order is charged once, nothing
// is dead-lettered and no deferred row is left.
func TestAnEventBehindABlockedParkedClaimIsChargedAfterTheRelease(t *testing.T) {
	e := newEnv(t, "secret-token")
	a, b := pair(77211, byCharge)
	e.blockedClaim(t, a, true)
	dl := &dlqRecorder{}
	h := deciderOf(t, e.svc, dl)
	handle(t, h, b)
	assertNoDeadLetters(t, dl, "b behind a's blocked claim")
	e.operator(t, a.OrderID, billing.ActionRelease)
	e.decideAll(t, h)
	assertNoDeadLetters(t, dl, "after the release")
	e.assertChargedOnce(t, a)
}

// Defect 3: b is deferred behind a's pending claim; a's claim becomes
// blocked; b's record is redelivered (its commit lost, an offset reset).
// The redelivery is committed as deferred — one row, no dead letter — and
// after `claim release` b is decided once: charged.
func TestARedeliveredDeferredRecordStaysDeferredBehindABlockedClaim(t *testing.T) {
	e := newEnv(t, "secret-token")
	a, b := pair(77221, byCharge)
	e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
	if ok, err := e.svc.Defer(context.Background(), b, recordOf(b)); err != nil || !ok {
		t.Fatalf("Defer = %v, %v; want true", ok, err)
	}
	e.completePass(t, 2*time.Hour)
	dl := &dlqRecorder{}
	h := deciderOf(t, e.svc, dl)
	handle(t, h, b)
	assertNoDeadLetters(t, dl, "b's redelivery")
	if n := e.deferredRows(t); n != 1 {
		t.Fatalf("%d deferred rows after the redelivery; want b's one", n)
	}
	e.operator(t, a.OrderID, billing.ActionRelease)
	e.decideAll(t, h)
	assertNoDeadLetters(t, dl, "after the release")
	e.assertChargedOnce(t, b)
}

// Defect 7: an event whose own claim is past block-after when it is
// redelivered blocks the claim without a re-send and is deferred behind
// it, not dead-lettered; after `claim release` it charges the order once.
func TestAnEventBehindItsOwnBlockedClaimIsChargedAfterTheRelease(t *testing.T) {
	e := newEnv(t, "secret-token")
	ev := event(77231, 1500)
	e.pendingClaim(t, ev, paysim.Faults{ErrorRate: 1})
	e.age(t, 2*time.Hour)
	svc, err := billing.New(billing.Config{Store: postgres.NewStoreOn(e.pool), Charger: e.charger, Group: group, Logger: discard(),
		Now: func() time.Time { return now }, DBTimeout: 5 * time.Second, ClaimBlockAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dl := &dlqRecorder{}
	h := deciderOf(t, svc, dl)
	handle(t, h, ev)
	assertNoDeadLetters(t, dl, "the redelivery past block-after")
	if st, n := e.status(t, ev.OrderID), e.deferredRows(t); st != "blocked" || n != 1 || e.sim.ChargesFor(ev.OrderID) != 0 {
		t.Fatalf("claim %q, %d deferred rows, %d charges; want blocked, 1, none", st, n, e.sim.ChargesFor(ev.OrderID))
	}
	e.operator(t, ev.OrderID, billing.ActionRelease)
	e.decideAll(t, h)
	assertNoDeadLetters(t, dl, "after the release")
	e.assertChargedOnce(t, ev)
}

// Defect 4: a parked event whose re-send the provider refuses for good
// (402) — the completer may only block the claim — keeps its record:
// before the operator decides, the deciding loop leaves it; after `claim
// release` it is decided as a fresh attempt, refused again, and
// dead-lettered `permanent` with its original record (replayable), its
// claim released by that attempt; after `claim mark-charged` it is a
// duplicate. No row is left either way.
func TestAParkedEventRefusedForGoodKeepsAPath(t *testing.T) {
	e := newEnv(t, "secret-token")
	order := int64(77240)
	for _, action := range []billing.OperatorAction{billing.ActionRelease, billing.ActionMarkCharged} {
		order++
		t.Run(string(action), func(t *testing.T) {
			a := event(order, 1500)
			e.pendingClaim(t, a, paysim.Faults{ErrorRate: 1})
			if ok, err := e.svc.Park(context.Background(), a, recordOf(a)); err != nil || !ok {
				t.Fatalf("Park = %v, %v; want true", ok, err)
			}
			e.sim.SetFaults(paysim.Faults{Decline: func(o int64) bool { return o == order }})
			defer e.sim.SetFaults(paysim.Faults{})
			c := e.completer(t, e.charger, 0)
			waitSettled(t, func() billing.PassReport {
				rep, err := c.RunOnce(context.Background(), billing.PassOptions{ParkedOnly: true})
				if err != nil {
					t.Fatalf("parked pass: %v", err)
				}
				return rep
			}, "blocked")
			dl := &dlqRecorder{}
			h := deciderOf(t, e.svc, dl)
			e.expireLeases(t)
			if err := h.DecideDeferred(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n := e.deferredRows(t); n != 1 {
				t.Fatalf("%d deferred rows behind the refused parked claim; want its record kept (1)", n)
			}
			assertNoDeadLetters(t, dl, "before the operator")
			e.operator(t, order, action)
			e.decideAll(t, h)
			if action == billing.ActionMarkCharged {
				assertNoDeadLetters(t, dl, "after mark-charged")
				if st := e.status(t, order); st != "charged" || e.sim.ChargesFor(order) != 0 {
					t.Fatalf("claim %q, %d charges; want charged by the operator, none sent", st, e.sim.ChargesFor(order))
				}
				return
			}
			dl.mu.Lock()
			defer dl.mu.Unlock()
			if len(dl.why) != 1 || dl.why[0] != dlq.Permanent || !bytes.Equal(dl.sent[0].Value, eventJSON(a)) ||
				string(dl.sent[0].Key) != fmt.Sprint(order) || len(dl.sent[0].Headers) != 1 {
				t.Fatalf("dead letters %v %+v; want one permanent with a's original record", dl.why, dl.sent)
			}
			if n, _ := e.ledger(t, order); n != 0 || e.sim.ChargesFor(order) != 0 {
				t.Fatalf("%d ledger rows, %d charges; want the refused claim released, nothing charged", n, e.sim.ChargesFor(order))
			}
		})
	}
}
