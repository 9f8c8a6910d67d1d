package billing_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/pipeline"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// newDecidingHandler is a pipeline over svc whose dead letters go to dl.
func newDecidingHandler(t *testing.T, svc *billing.Service, dl *dlqRecorder) *pipeline.Handler {
	t.Helper()
	h, err := pipeline.New(pipeline.Config{Biller: svc, DLQ: dl, Decisions: svc, Metrics: metrics.New(prometheus.NewRegistry(), "test", "test"),
		Logger: discard(), Now: time.Now, MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// SPEC §11 I2 and I3: a dead-letter decision is the event's with its
// parameters (order, customer, amount: dead_letter's key), so a dead
// letter decided for ANOTHER BODY under the event's id never answers the
// valid event's own retry. Found by the review of the first cut of
// migration 00012, keyed by event_id alone, where this test failed:
// "the valid event answered "conflict" …; I2: event … has a conflict dead
// letter and is charged", on both billers.
//
// The scenario is TestSameEventIDWithAnotherBodyIsConflict's, with the
// pipeline in it: the valid event's first attempt leaves its claim pending
// (a 500; its delivery is retrying), a forged or buggy record with the same
// event_id and another amount is a true conflict and is dead-lettered
// `conflict` by the pipeline, which stores the decision for its body.
// With that key, the valid event's next retry (the same delivery, the
// same attempt) was answered by that decision before its claim was even looked at:
// dead-lettered `conflict` too and committed, although its own claim is
// pending with the right body. The completer then charges that claim: a
// `conflict` dead letter for an event that was charged (I2: "never conflict
// for an event that was later charged"); had the completer been refused,
// the valid order's only trace would be a conflict dead letter, which the
// runbook does not replay (I3). Before migration 00012 the retry charged
// (TestSameEventIDWithAnotherBodyIsConflict). The model cannot find it:
// each of its events has its own key (modelID), one body per key.
func TestAnotherBodysDeadLetterNeverAnswersTheValidEvent(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		b := e.billerOf(t, k, e.svc)
		dl := &dlqRecorder{}
		h := newDecidingHandler(t, e.svc, dl)
		ctx := billing.WithAttempt(context.Background()) // the valid event's delivery, retrying
		ev := event(8802, 1000)

		e.sim.SetFaults(paysim.Faults{ErrorRate: 1}) // 500: nothing taken, the claim stays pending
		if _, err := b.Process(ctx, ev); !fault.Is(err, fault.Transient) {
			t.Fatalf("first attempt: %v; want transient", err)
		}
		e.sim.SetFaults(paysim.Faults{})

		forged := ev
		forged.TotalAmount = 99900
		if err := h.Handle(context.Background(), kafkaRecord(forged, 0)); err != nil {
			t.Fatal(err)
		}
		dl.mu.Lock()
		why := slices.Clone(dl.why)
		dl.mu.Unlock()
		if !slices.Equal(why, []dlq.Reason{dlq.Conflict}) {
			t.Fatalf("the forged record's dead letters %v; want [conflict]", why)
		}

		res, err := b.Process(ctx, ev) // the valid event's retry
		t.Logf("the valid event's retry after the forged record's dead letter: %+v, %v; claim %q", res, err, e.status(t, ev.OrderID))
		if err != nil || res.Outcome != billing.Charged {
			t.Errorf("the valid event's retry: %+v, %v; want charged: the conflict was another body's", res, err)
		}
		if d, ok := billing.AsDeadLettered(err); ok {
			rep, cerr := e.completer(t, e.charger, 2*time.Minute).RunOnce(context.Background(), billing.PassOptions{})
			if cerr != nil {
				t.Fatal(cerr)
			}
			t.Logf("the valid event answered %q (it would be dead-lettered so and committed); the completer then settles its claim: %+v",
				d.Reason, rep.Settled)
			if st := e.status(t, ev.OrderID); st == "charged" {
				t.Errorf("I2: event %s has a %s dead letter and is charged", ev.EventID, d.Reason)
			}
		}
	})
}
