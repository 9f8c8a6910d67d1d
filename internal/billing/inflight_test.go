package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// heldCharger fails the victim's first request (an unknown outcome, as
// in an outage) and holds its second — the creating attempt's own retry —
// at the provider until release is closed, then lets the provider take
// it. Every other request (companions, later events) goes straight to
// the provider.
type heldCharger struct {
	e        *env
	victim   string
	calls    int
	inFlight chan struct{} // closed when the held request is in flight
	release  chan struct{}
}

func (h *heldCharger) Charge(ctx context.Context, req billing.ChargeRequest) (billing.ChargeResult, error) {
	if req.IdempotencyKey == h.victim {
		h.calls++
		switch h.calls {
		case 1:
			return billing.ChargeResult{}, fault.Errorf(fault.Transient, "provider unavailable (outage)")
		case 2:
			close(h.inFlight)
			select {
			case <-h.release:
			case <-ctx.Done():
				return billing.ChargeResult{}, fault.New(fault.Transient, ctx.Err())
			}
		}
	}
	return h.e.charger.Charge(ctx, req)
}

// Defect 1 of issue 29 (SPEC §11 I5): the creating attempt's retry is in
// flight at the provider when the completer blocks the claim (past
// BILLING_CLAIM_BLOCK_AFTER) and the operator, finding no charge for the
// key at the provider yet, follows the runbook: `claim release`. The
// release must be refused; the held request then takes the money, the
// claim becomes charged (recordSQL: blocked -> charged) and a second event
// for the order is a duplicate_order, never a second charge.
func TestNoReleaseUnderTheCreatorsRetryInFlight(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		order := int64(29001)
		if k.batched {
			order++
		}
		ev := event(order, 4200)
		h := &heldCharger{e: e, victim: ev.EventID.String(), inFlight: make(chan struct{}), release: make(chan struct{})}
		b := e.biller(t, k, e.pool, h)
		ctx := billing.WithAttempt(context.Background())
		if _, err := b.Process(ctx, ev); !fault.Is(err, fault.Transient) {
			t.Fatalf("first try: %v; want transient (outcome unknown)", err)
		}
		type answer struct {
			res billing.Result
			err error
		}
		retried := make(chan answer, 1)
		go func() {
			res, err := b.Process(ctx, ev) // the creator's retry
			retried <- answer{res, err}
		}()
		select {
		case <-h.inFlight:
		case a := <-retried:
			t.Fatalf("the creator's retry answered %+v, %v before its request was held", a.res, a.err)
		case <-time.After(10 * time.Second):
			t.Fatal("the creator's retry never sent its request")
		}
		e.completePass(t, 2*time.Hour) // past block-after: blocked, not re-sent
		if st := e.status(t, order); st != "blocked" {
			t.Fatalf("claim %q after the completer's pass, want blocked", st)
		}
		req := billing.OperatorRequest{OrderID: order, Action: billing.ActionRelease, Operator: "oncall",
			Reason: "provider shows no charge for the key", ProviderHoldsNoCharge: true}
		_, relErr := billing.ApplyOperator(context.Background(), postgres.NewStoreOn(e.pool), discard(), req)
		if !errors.Is(relErr, billing.ErrUnsafe) {
			t.Errorf("claim release while the creator's retry is in flight: %v; want refused (ErrUnsafe)", relErr)
		}
		close(h.release)
		a := <-retried
		if a.err != nil || a.res.Outcome != billing.Charged {
			t.Errorf("the held retry, taken by the provider: %+v, %v; want charged", a.res, a.err)
		}
		second := event(order, 4200)
		res, err := settle(context.Background(), t, b, second)
		if err != nil || res.Outcome != billing.DuplicateOrder {
			t.Errorf("a second event for the order: %+v, %v; want duplicate_order", res, err)
		}
		if n := e.sim.ChargesFor(order); n != 1 {
			t.Fatalf("the provider took %d charges for order %d, want 1", n, order)
		}
		e.assertChargedOnce(t, ev)
	})
}

// The creating attempt records its first send with the claim itself and
// each retry with a statement of its own before the request leaves
// (claim_send, sender "creator"), each moving in_flight_until and
// decide_after (= D plus the provider's bound) on; and the request's
// context ends no later than the deadline recorded.
func TestTheCreatorsRetriesRecordTheirSends(t *testing.T) {
	e := newEnv(t, "secret-token")
	ctx := context.Background()
	const d, bound = 20 * time.Second, 3 * time.Minute
	var deadlines []time.Time
	fail := chargerFunc(func(ctx context.Context, req billing.ChargeRequest) (billing.ChargeResult, error) {
		dl, ok := ctx.Deadline()
		if !ok {
			t.Errorf("request sent without a deadline")
		}
		deadlines = append(deadlines, dl)
		return billing.ChargeResult{}, fault.Errorf(fault.Transient, "502 from the gateway")
	})
	svc, err := billing.New(billing.Config{Store: postgres.NewStoreOn(e.pool), Charger: fail, Group: group, Now: func() time.Time { return now },
		Logger: discard(), DBTimeout: 5 * time.Second, Sends: billing.SendConfig{Deadline: d, ProviderMaxProcessing: bound, Host: "pod-a"}})
	if err != nil {
		t.Fatal(err)
	}
	ev := event(29101, 700)
	attempt := billing.WithAttempt(ctx)
	var untils []time.Time
	for try := range 3 {
		if _, err := svc.Process(attempt, ev); !fault.Is(err, fault.Transient) {
			t.Fatalf("try %d: %v; want transient", try, err)
		}
		var until, after time.Time
		var sends int
		if err := e.pool.QueryRow(ctx, `SELECT in_flight_until, decide_after, (SELECT count(*) FROM claim_send WHERE order_id = $1 AND sender = 'creator' AND host = 'pod-a')
FROM charge WHERE order_id = $1`, ev.OrderID).Scan(&until, &after, &sends); err != nil {
			t.Fatal(err)
		}
		if sends != try || after.Sub(until) != bound {
			t.Errorf("try %d: %d creator sends recorded, decide_after - in_flight_until = %s; want %d, %s", try, sends, after.Sub(until), try, bound)
		}
		if try > 0 && !until.After(untils[try-1]) {
			t.Errorf("try %d: in_flight_until %s did not move on from %s", try, until, untils[try-1])
		}
		// The deadline was fixed before the record: never later than it.
		if dl := deadlines[try]; dl.After(until.Add(50 * time.Millisecond)) {
			t.Errorf("try %d: the request's deadline %s is after the recorded in_flight_until %s", try, dl, until)
		}
		untils = append(untils, until)
	}
	sends, err := billing.ClaimSends(ctx, postgres.NewStoreOn(e.pool), ev.OrderID, mustShow(t, e, ev.OrderID))
	if err != nil || len(sends) != 3 || !sends[0].FirstSend || sends[0].Host != "pod-a" || sends[1].Sender != billing.SenderCreator || sends[1].FirstSend {
		t.Fatalf("ClaimSends = %+v, %v; want the first send and two creator retries from pod-a", sends, err)
	}
}

func mustShow(t *testing.T, e *env, order int64) *billing.OperatorClaim {
	t.Helper()
	cl, _, err := billing.ShowClaim(context.Background(), postgres.NewStoreOn(e.pool), order)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// release and mark-charged refuse while the latest recorded send's
// deadline plus the provider's bound (decide_after) is ahead, and say
// from when they are allowed; once it has passed, they are allowed.
func TestOperatorRefusedUntilDecideAfter(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	for i, req := range []billing.OperatorRequest{
		{Action: billing.ActionRelease, Operator: "alice", Reason: "provider has no charge", ProviderHoldsNoCharge: true},
		{Action: billing.ActionMarkCharged, Operator: "alice", Reason: "provider shows ch_1", ChargeID: "ch_1"},
	} {
		req.OrderID = int64(29200 + i)
		opClaim(t, pool, req.OrderID, "blocked")
		var want time.Time
		if err := pool.QueryRow(ctx, `UPDATE charge SET in_flight_until = now() + interval '10 minutes', decide_after = now() + interval '15 minutes'
WHERE order_id = $1 RETURNING decide_after`, req.OrderID).Scan(&want); err != nil {
			t.Fatal(err)
		}
		_, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), discard(), req)
		var inFlight *billing.InFlightError
		if !errors.As(err, &inFlight) || !errors.Is(err, billing.ErrUnsafe) || !inFlight.AllowedAt.Equal(want) ||
			inFlight.Wait < 14*time.Minute || inFlight.Wait > 15*time.Minute {
			t.Fatalf("%s while in flight: %v; want an InFlightError allowed at %s, in about 15m", req.Action, err, want)
		}
		if st, _ := opStatus(t, pool, req.OrderID); st != "blocked" || opAudits(t, pool, req.OrderID) != 0 {
			t.Fatalf("%s refused, but the claim is %s with %d audit rows", req.Action, st, opAudits(t, pool, req.OrderID))
		}
		if _, err := pool.Exec(ctx, `UPDATE charge SET in_flight_until = now() - interval '6 minutes', decide_after = now() - interval '1 second' WHERE order_id = $1`, req.OrderID); err != nil {
			t.Fatal(err)
		}
		if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), discard(), req); err != nil {
			t.Fatalf("%s once decide_after has passed: %v", req.Action, err)
		}
	}
}

// A replica of a release that does not record its creator's sends (level
// below billing.SendsRecordedFrom) may have a request in flight for any
// claim: while one heartbeats, every release and mark-charged is refused;
// a replica of this release, or a stale registration, does not stop them.
func TestOperatorRefusedWhileAnOldReplicaRuns(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	const order = 29300
	opClaim(t, pool, order, "blocked") // made before migration 00010: no recorded send
	if _, err := pool.Exec(ctx, `INSERT INTO billing_replica (replica_id, binary_level, version, consumer_group) VALUES
('new-1', $1, 'v-new', 'g'), ('old-1', 8, 'v-old', 'g')`, billing.SendsRecordedFrom); err != nil {
		t.Fatal(err)
	}
	req := billing.OperatorRequest{OrderID: order, Action: billing.ActionRelease, Operator: "alice", Reason: "provider has no charge", ProviderHoldsNoCharge: true}
	if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), discard(), req); !errors.Is(err, billing.ErrUnsafe) {
		t.Fatalf("release while a level-8 replica heartbeats: %v; want refused", err)
	} else {
		t.Logf("refused: %v", err)
	}
	if st, _ := opStatus(t, pool, order); st != "blocked" {
		t.Fatalf("claim %s after the refusal, want blocked", st)
	}
	// Stale (past ReplicaStaleAfter) but within the provider's bound of
	// its last request: still refused (the claim records no bound of its
	// own: UnrecordedProviderBound).
	if _, err := pool.Exec(ctx, `UPDATE billing_replica SET heartbeat_at = now() - interval '2 minutes' WHERE replica_id = 'old-1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), discard(), req); !errors.Is(err, billing.ErrUnsafe) {
		t.Fatalf("release 2 minutes after an old replica's last heartbeat, within the provider's bound: %v; want refused", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE billing_replica SET heartbeat_at = now() - interval '7 minutes' WHERE replica_id = 'old-1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), discard(), req); err != nil {
		t.Fatalf("release once the old replica's heartbeat is stale and the provider's bound over: %v", err)
	}
}

// inFlightOver moves the recorded sends of order's claim into the past, as
// if the operator had waited until its decide_after: no request for it can
// still take money.
func (e *env) inFlightOver(t *testing.T, order int64) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `UPDATE charge SET in_flight_until = least(in_flight_until, now() - interval '1 second'),
decide_after = least(decide_after, now() - interval '1 second') WHERE order_id = $1`, order); err != nil {
		t.Fatal(err)
	}
}

// TestOperatorWaitsOutAnOldReplicasLastRequest (SPEC §11 I5, rolling upgrade beside level 8). A level-8 replica
// sends without recording anything. It was SIGKILLed (its heartbeat row
// stays, going stale) right after it sent the request of a claim that
// is now blocked; its last heartbeat is 61 s old. The claim records that
// its senders' provider bound is 5 minutes (decide_after - in_flight_until),
// so the provider may still take that request's money for minutes.
// A release now, followed by another event charging the order while the
// old request may still be taken, would charge twice (I1): the command
// refuses until the old replica's last heartbeat + the stale window + the
// provider bound. (A review found the guard allowing it at heartbeat
// + 60 s.)
func TestOperatorWaitsOutAnOldReplicasLastRequest(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	const order = 29901
	opClaim(t, pool, order, "blocked")
	// The claim's own recorded sends are long over; the bound its senders
	// recorded is 5 minutes.
	if _, err := pool.Exec(ctx, `UPDATE charge SET in_flight_until = now() - interval '10 minutes', decide_after = now() - interval '5 minutes'
WHERE order_id = $1`, order); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO billing_replica (replica_id, binary_level, version, consumer_group, heartbeat_at)
VALUES ('old-1', 8, 'v-old', 'g', now() - interval '61 seconds')`); err != nil {
		t.Fatal(err)
	}
	req := billing.OperatorRequest{OrderID: order, Action: billing.ActionRelease, Operator: "alice",
		Reason: "provider shows no charge yet", ProviderHoldsNoCharge: true}
	if _, err := billing.ApplyOperator(ctx, postgres.NewStoreOn(pool), discard(), req); err == nil {
		st, _ := opStatus(t, pool, order)
		t.Fatalf("release allowed (claim now %s) 61 s after the last heartbeat of a level-8 replica that sends unrecorded, "+
			"while the provider may still take its last request for up to 5 minutes (the claim's recorded bound): "+
			"want refused until the old replica's last possible send + the provider bound", st)
	} else {
		t.Logf("refused: %v", err)
	}
}
