package billing_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// Tests of the release rule (SPEC §6): a claim is released only on a
// definite refusal of a request made by the attempt that created it, when
// none of that attempt's requests had an unknown outcome and no other
// attempt has sent the claim's request.

// The four steps of the interleaving an adversarial review found: the
// creating attempt A1 commits its claim and loses its link to Postgres at
// the charge transaction's BEGIN, so it has sent nothing; another sender
// (the completer on another replica, or a redelivery) sends the claim's
// request, the provider takes the money and the answer is lost; A1's
// retry, still the creator with no unknown outcome of its own, is refused
// by a gateway's 404. The claim must survive: released, it lets a
// distinct event for the order charge it again.
func TestNoReleaseAfterAnotherSenderSent(t *testing.T) {
	for _, sender := range []string{"completer", "redelivery"} {
		t.Run(sender, func(t *testing.T) {
			forEachBiller(t, func(t *testing.T, k billerKind) {
				e := newEnv(t, "secret-token")
				gw := gatewayNotFound(t).ForBilling()
				const order = 8400
				ev := event(order, 1000)
				in := newInjector()
				in.failAt, in.mode = 1, connLost // op 0 is the claim, op 1 the BEGIN
				var viaGateway atomic.Bool
				a1 := e.biller(t, k, faultDB{e.pool, in}, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
					if viaGateway.Load() && !isCompanion(ch.IdempotencyKey) {
						return gw.Charge(ctx, ch)
					}
					return e.charger.Charge(ctx, ch)
				}))
				attempt := billing.WithAttempt(context.Background())
				if _, err := a1.Process(attempt, ev); err == nil {
					t.Fatalf("A1: no error; want the lost BEGIN (ops %q)", in.trace())
				}
				e.sim.SetFaults(paysim.Faults{ResetRate: 1}) // taken, the answer lost
				switch sender {
				case "completer":
					t.Logf("completer pass: %+v", e.completePass(t, 2*time.Minute).Settled)
				case "redelivery":
					_, err := e.biller(t, k, e.pool, e.charger).Process(context.Background(), ev)
					t.Logf("redelivery: %v", err)
				}
				e.sim.SetFaults(paysim.Faults{})
				if n := e.sim.ChargesFor(order); n != 1 {
					t.Fatalf("setup: the provider took %d charges for order %d, want 1", n, order)
				}
				viaGateway.Store(true)
				_, err := a1.Process(attempt, ev)
				t.Logf("A1's retry through the gateway: %v", err)
				if st := e.status(t, order); st == "" {
					t.Errorf("A1 released the claim although %s's request took the money", sender)
				}
				other := event(order, 1000) // a distinct event for the order
				if res, err := e.svc.Process(context.Background(), other); err == nil && res.Outcome == billing.Charged {
					t.Fatalf("a distinct event charged order %d again: %d charges at the provider", order, e.sim.ChargesFor(order))
				}
				e.completePass(t, 2*time.Minute) // recovery: the provider replays its stored answer
				if res, err := settle(context.Background(), t, e.svc, other); err != nil || res.Outcome != billing.DuplicateOrder {
					t.Fatalf("the distinct event after recovery: %+v, %v; want duplicate_order", res, err)
				}
				e.assertChargedOnce(t, ev)
			})
		})
	}
}

// replayFront is a raw HTTP/1.1 front of the simulator. The first request
// on its first connection is answered normally (a warm keep-alive
// connection); the second is passed to the simulator, which takes the
// money, and then the connection is closed without an answer, so that
// net/http replays the request on a new connection (it may: the request
// carries an Idempotency-Key and GetBody). Every later request is refused
// with a gateway's 404, which stores nothing under the key.
func replayFront(t *testing.T, sim http.Handler) (url string, requests func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close() // the client's idle keep-alive connections
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					rec := httptest.NewRecorder()
					switch n.Add(1) {
					case 1:
						sim.ServeHTTP(rec, req)
					case 2:
						sim.ServeHTTP(rec, req)
						return // taken; the connection dropped before the answer
					default:
						http.Error(rec, `{"error":{"code":"no_route"}}`, http.StatusNotFound)
					}
					res := rec.Result()
					res.ContentLength = int64(rec.Body.Len())
					if err := res.Write(conn); err != nil {
						return
					}
				}
			})
		}
	})
	return "http://" + ln.Addr().String(), func() int { return int(n.Load()) }
}

// net/http silently replays a charge whose keep-alive connection was
// reset after the request was written; the replay meets a gateway's 404.
// That refusal answers the copy, not the request the provider took: the
// outcome is unknown, and the creating attempt must keep its claim.
func TestRefusalOfASilentReplayKeepsTheClaim(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		url, requests := replayFront(t, e.sim)
		client, err := payment.New(payment.Config{BaseURL: url, Token: "secret-token", Timeout: 5 * time.Second, MaxConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		front := client.ForBilling()
		b := e.biller(t, k, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			if isCompanion(ch.IdempotencyKey) {
				return e.charger.Charge(ctx, ch)
			}
			return front.Charge(ctx, ch)
		}))
		warm := event(8500, 300)
		if res, err := b.Process(billing.WithAttempt(context.Background()), warm); err != nil || res.Outcome != billing.Charged {
			t.Fatalf("warm-up charge: %+v, %v", res, err)
		}
		const order = 8501
		ev := event(order, 1000)
		_, err = b.Process(billing.WithAttempt(context.Background()), ev)
		t.Logf("the charge: %v (the front read %d requests)", err, requests())
		if requests() != 3 {
			t.Fatalf("the front read %d requests, want 3 (warm-up, taken, replay): net/http did not replay", requests())
		}
		if st := e.status(t, order); st == "" {
			t.Errorf("the claim was released on the refusal of a silent replay, although the first copy was charged")
		}
		other := event(order, 1000)
		if res, err := e.svc.Process(context.Background(), other); err == nil && res.Outcome == billing.Charged {
			t.Fatalf("a distinct event charged order %d again: %d charges at the provider", order, e.sim.ChargesFor(order))
		}
		e.completePass(t, 2*time.Minute)
		if res, err := settle(context.Background(), t, e.svc, other); err != nil || res.Outcome != billing.DuplicateOrder {
			t.Fatalf("the distinct event after recovery: %+v, %v; want duplicate_order", res, err)
		}
		e.assertChargedOnce(t, ev)
	})
}

// A claim that vanishes between its charge and the record (something
// deleted it: only an operator or a foreign binary can) is a stray charge
// (the 2xx rule, SPEC §11): its event is charged, with a claim of its
// own and the stray recorded in the batch's transaction; the other events
// of its batch are charged and recorded as usual.
func TestVanishedClaimIsAStrayChargeOfItsBatch(t *testing.T) {
	e := newEnv(t, "secret-token")
	victim := event(8600, 1000)
	in := newInjector()
	in.gate = func(_ int, name string) {
		if name == "record" {
			if _, err := e.pool.Exec(context.Background(), "DELETE FROM charge WHERE order_id = $1", victim.OrderID); err != nil {
				t.Error(err)
			}
		}
	}
	svc := newService(t, faultDB{e.pool, in}, e.charger)
	batch := []events.OrderConfirmed{event(8601, 100), victim, event(8602, 200)}
	res, errs := billing.ProcessBatch(billing.WithAttempt(context.Background()), svc, batch, 1)
	for i, ev := range batch {
		t.Logf("order %d: %+v, %v", ev.OrderID, res[i], errs[i])
		if errs[i] != nil || res[i].Outcome != billing.Charged {
			t.Errorf("order %d: %+v, %v; want charged", ev.OrderID, res[i], errs[i])
		}
		if st := e.status(t, ev.OrderID); st != "charged" {
			t.Errorf("order %d: ledger status %q; want charged", ev.OrderID, st)
		}
		if n := e.processedRows(t, ev.EventID); n != 1 {
			t.Errorf("order %d: %d processed_event rows; want 1", ev.OrderID, n)
		}
	}
	if got := e.strays(t, victim.OrderID, victim.EventID); len(got) != 1 || got[0] != res[1].ChargeID {
		t.Errorf("stray charges of the vanished claim's event: %q; want one, %q", got, res[1].ChargeID)
	}
}

// gatewayNotFound is a client to a gateway in front of the provider that
// answers every charge 404 (a deploy, a wrong route): a definite refusal
// that stores nothing under the key.
func gatewayNotFound(t *testing.T) *payment.Client {
	t.Helper()
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"code":"no_route"}}`, http.StatusNotFound)
	}))
	t.Cleanup(gw.Close)
	c, err := payment.New(payment.Config{BaseURL: gw.URL, Token: "secret-token", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Two deliveries of one event at once (a rebalance: the old owner still
// billing, the new one starting from the committed offset). The first
// creates the claim; its request is refused by something in front of the
// provider (a gateway's 404 during a deploy: a definite refusal, nothing
// stored under the key), so it releases the claim. The second saw the
// claim as its own pending one before the release, and sends the same
// request, which the provider takes. The claim it charged under is gone:
// the order must not be free for a third event to charge again.
func TestRedeliverySendsAfterTheCreatorReleasedTheClaim(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		gwClient := gatewayNotFound(t)
		ev := event(8101, 1000)
		firstSending, secondPastLookup := make(chan struct{}), make(chan struct{})
		first := e.biller(t, k, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			if isCompanion(ch.IdempotencyKey) {
				return e.charger.Charge(ctx, ch)
			}
			close(firstSending)
			<-secondPastLookup
			return gwClient.ForBilling().Charge(ctx, ch)
		}))
		in := newInjector()
		in.gate = func(_ int, name string) {
			if name == "dedup insert" { // the second delivery decided to charge its own pending claim
				close(secondPastLookup)
			}
		}
		second := e.biller(t, k, faultDB{e.pool, in}, e.charger)

		ctx := context.Background()
		firstErr := make(chan error, 1)
		go func() { _, err := first.Process(ctx, ev); firstErr <- err }()
		<-firstSending
		res2, err2 := second.Process(ctx, ev)
		if err := <-firstErr; !fault.Is(err, fault.Permanent) {
			t.Fatalf("first delivery: %v; want permanent (the gateway's 404)", err)
		}
		t.Logf("second delivery: %+v, %v (ops %q)", res2, err2, in.trace())
		if fault.Is(err2, fault.Transient) || fault.Is(err2, fault.Systemic) {
			res2, err2 = settle(ctx, t, e.svc, ev) // the pipeline retries it
			t.Logf("second delivery retried: %+v, %v", res2, err2)
		}
		// A distinct event for the order, from another record key.
		other := event(8101, 1000)
		ores, oerr := settle(ctx, t, e.svc, other)
		t.Logf("other event: %+v, %v", ores, oerr)
		if n := e.sim.ChargesFor(8101); n != 1 {
			t.Fatalf("provider took %d charges for order 8101, want 1", n)
		}
		if err2 != nil || res2.Outcome != billing.Charged {
			t.Fatalf("second delivery: %+v, %v; want charged", res2, err2)
		}
		e.assertChargedOnce(t, ev)
	})
}

// The completer re-sends a claim whose creating attempt is still in flight
// (its claim looks old: a replica's clock behind the completer's, or a
// stalled process). The creator's request is refused by a gateway (a
// definite refusal, nothing stored under the key) and it releases the
// claim while the completer's request, same key, reaches the provider and
// is charged. The order must stay claimed: no other event may charge it.
func TestCompleterSendsWhileTheCreatorReleasesTheClaim(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		gwClient := gatewayNotFound(t)
		ev := event(8102, 1000)
		firstSending, completerSending, firstDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		first := e.biller(t, k, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			if isCompanion(ch.IdempotencyKey) {
				return e.charger.Charge(ctx, ch)
			}
			close(firstSending)
			<-completerSending
			return gwClient.ForBilling().Charge(ctx, ch)
		}))
		ctx := context.Background()
		go func() { _, err := first.Process(ctx, ev); firstDone <- err }()
		<-firstSending
		var firstErr error
		finished := false
		e.age(t, 2*time.Minute) // the claim looks old: a stalled creator
		c := &billing.Completer{Sessions: postgres.NewSessions(postgres.FromPool(e.pool)), After: time.Minute, BlockAfter: time.Hour, Logger: discard(),
			Now: func() time.Time { return now },
			Charger: chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
				if isCompanion(ch.IdempotencyKey) {
					return e.charger.Charge(ctx, ch)
				}
				close(completerSending)
				// Send once the creator has released (finished) or waits to.
				for deadline := time.Now().Add(20 * time.Second); !finished; {
					select {
					case firstErr = <-firstDone:
						finished = true
						continue
					default:
					}
					if releaseWaits(t, e) {
						break
					}
					if time.Now().After(deadline) {
						t.Error("the creator neither finished nor waits to release after 20 s")
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				return e.charger.Charge(ctx, ch)
			})}
		rep, err := c.RunOnce(ctx, billing.PassOptions{})
		t.Logf("completer pass: %+v, %v", rep.Settled, err)
		if !finished {
			firstErr = <-firstDone
		}
		t.Logf("creator: %v", firstErr)
		other := event(8102, 1000)
		ores, oerr := settle(ctx, t, e.svc, other)
		t.Logf("other event: %+v, %v", ores, oerr)
		if n := e.sim.ChargesFor(8102); n != 1 {
			t.Fatalf("provider took %d charges for order 8102, want 1", n)
		}
		e.assertChargedOnce(t, ev)
	})
}

// releaseWaits reports whether a release of a claim waits on a lock.
func releaseWaits(t *testing.T, e *env) bool {
	t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM charge%'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A request of the attempt that created the claim timed out after the
// provider took the money; the attempt's retry is refused by something in
// front of the provider (a gateway's 404, a WAF's 403, a proxy's 407):
// that refusal says nothing about the first request, so the claim must
// stay. Released, it lets another event for the order charge it again.
func TestRefusalAfterAnUnknownOutcomeOfTheSameAttemptKeepsTheClaim(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		for n, refusal := range []*payment.Error{
			{Status: 404, Kind: fault.Permanent},
			{Status: 403, Kind: fault.Systemic},
			{Status: 402, Kind: fault.Permanent, Code: "card_declined"},
		} {
			order := int64(9100 + n)
			var calls atomic.Int32
			c := chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
				if isCompanion(ch.IdempotencyKey) {
					return e.charger.Charge(ctx, ch)
				}
				if calls.Add(1) == 1 {
					if _, err := e.charger.Charge(ctx, ch); err != nil {
						t.Fatalf("order %d: first charge: %v", order, err)
					}
					return billing.ChargeResult{}, fault.New(fault.Transient, &payment.Error{Kind: fault.Transient, Err: context.DeadlineExceeded})
				}
				return billing.ChargeResult{}, fault.New(refusal.Kind, refusal)
			})
			svc := e.biller(t, k, e.pool, c)
			ev := event(order, 500)
			ctx := billing.WithAttempt(context.Background()) // one delivery and its retries
			if _, err := svc.Process(ctx, ev); !fault.Is(err, fault.Transient) {
				t.Fatalf("order %d, timed out: %v; want transient", order, err)
			}
			if _, err := svc.Process(ctx, ev); err == nil {
				t.Fatalf("order %d, refused retry: no error", order)
			}
			if st := e.status(t, order); st != "pending" {
				t.Errorf("order %d: after a timeout then %d in the same attempt, ledger status %q; want pending (the first request may have taken the money)",
					order, refusal.Status, st)
			}
			other := event(order, 500) // another event for the same order
			if res, err := e.svc.Process(context.Background(), other); err == nil && res.Outcome == billing.Charged {
				t.Errorf("order %d: another event charged it again after %d released the claim: charged twice at the provider", order, refusal.Status)
			}
		}
	})
}

// A 403 can come from a WAF that inspected the provider's response, after
// the provider took the money (ModSecurity's response-phase rules deny
// with 403). It is Systemic: the pipeline retries the same event without
// limit, so a kept claim costs little, and a released one lets another
// event for the order charge it again.
func TestForbiddenKeepsTheClaim(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		for n, status := range []int{403} {
			order := int64(9200 + n)
			c := chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
				if isCompanion(ch.IdempotencyKey) {
					return e.charger.Charge(ctx, ch)
				}
				if _, err := e.charger.Charge(ctx, ch); err != nil {
					t.Fatalf("order %d: charge: %v", order, err)
				}
				return billing.ChargeResult{}, fault.New(fault.Systemic, &payment.Error{Status: status, Kind: fault.Systemic})
			})
			ev := event(order, 700)
			if _, err := e.biller(t, k, e.pool, c).Process(billing.WithAttempt(context.Background()), ev); !fault.Is(err, fault.Systemic) {
				t.Fatalf("order %d, %d: %v; want systemic", order, status, err)
			}
			if st := e.status(t, order); st != "pending" {
				t.Errorf("order %d: after %d, ledger status %q; want pending", order, status, st)
			}
			other := event(order, 700)
			if res, err := e.svc.Process(context.Background(), other); err == nil && res.Outcome == billing.Charged {
				t.Errorf("order %d: another event charged it again after %d released the claim: charged twice at the provider", order, status)
			}
		}
	})
}

// A decline after a 5xx leaves the claim pending, for the completer,
// whether it comes in the same attempt (the pipeline's retries of one
// delivery) or another (a redelivery after a crash): the 5xx may come
// from a gateway while the first request is still in flight at the
// provider, so the decline proves nothing about that earlier request
// (see TestRefusalAfterAnUnknownOutcomeOfTheSameAttemptKeepsTheClaim).
func TestDeclineAfterAnUnknownOutcome(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		b := e.billerOf(t, k, e.svc)
		for _, sameAttempt := range []bool{true, false} {
			order := int64(8010)
			if !sameAttempt {
				order = 8011
			}
			ev := event(order, 300)
			ctx := billing.WithAttempt(context.Background())
			e.sim.SetFaults(paysim.Faults{ErrorRate: 1})
			if _, err := b.Process(ctx, ev); !fault.Is(err, fault.Transient) {
				t.Fatalf("under 5xx: %v; want transient", err)
			}
			e.sim.SetFaults(paysim.Faults{Decline: func(o int64) bool { return o == order }})
			if !sameAttempt {
				ctx = billing.WithAttempt(context.Background()) // the redelivery
			}
			if _, err := b.Process(ctx, ev); !fault.Is(err, fault.Permanent) {
				t.Fatalf("declined: %v; want permanent", err)
			}
			if st := e.status(t, order); st != "pending" {
				t.Errorf("same attempt %v: ledger status %q, want pending (not released)", sameAttempt, st)
			}
		}
	})
}

// A claim made before claim_token existed (NULL) has no known creator: it
// scans (the binary uuid scan takes the NULL), no attempt counts as its
// creator, so a refusal does not release it, and the event's next
// delivery charges it once, through the Batcher as through Process.
func TestLegacyClaimWithoutToken(t *testing.T) {
	e := newEnv(t, "secret-token")
	b := billing.NewBatcher(e.svc, billing.BatcherConfig{MaxBatch: 4, MaxInFlight: 2, Callers: 4})
	defer b.Close()
	for _, tc := range []struct {
		name string
		p    func(context.Context, events.OrderConfirmed) (billing.Result, error)
		ev   events.OrderConfirmed
	}{{"batcher", b.Process, event(14300, 500)}, {"process", e.svc.Process, event(14301, 500)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			_, err := e.pool.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status, claim_token)
VALUES ($1, $2, $3, $4::numeric, $5, $5, 'pending', NULL)`, tc.ev.OrderID, tc.ev.EventID, tc.ev.CustomerID, tc.ev.TotalAmount.String(), now)
			if err != nil {
				t.Fatal(err)
			}
			e.declined[tc.ev.OrderID] = true
			e.sim.SetFaults(paysim.Faults{Decline: e.decline})
			if _, err := tc.p(billing.WithAttempt(ctx), tc.ev); !fault.Is(err, fault.Permanent) {
				t.Fatalf("declined charge: %v; want permanent", err)
			}
			if st := e.status(t, tc.ev.OrderID); st != "pending" {
				t.Fatalf("after a refusal of a claim whose creator is unknown: status %q; want pending (kept)", st)
			}
			if n := e.sim.ChargesFor(tc.ev.OrderID); n != 0 {
				t.Fatalf("declined order charged %d times", n)
			}
		})
	}
	ev := event(14302, 700)
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status, claim_token)
VALUES ($1, $2, $3, $4::numeric, $5, $5, 'pending', NULL)`, ev.OrderID, ev.EventID, ev.CustomerID, ev.TotalAmount.String(), now); err != nil {
		t.Fatal(err)
	}
	e.sim.SetFaults(paysim.Faults{})
	if res, err := b.Process(billing.WithAttempt(context.Background()), ev); err != nil || res.Outcome != billing.Charged {
		t.Fatalf("redelivery of a legacy claim's event: %+v, %v; want charged", res, err)
	}
	if n, _ := e.ledger(t, ev.OrderID); n != 1 || e.sim.ChargesFor(ev.OrderID) != 1 || e.status(t, ev.OrderID) != "charged" {
		t.Fatalf("legacy claim: %d rows, %d charges, status %q; want 1, 1, charged", n, e.sim.ChargesFor(ev.OrderID), e.status(t, ev.OrderID))
	}
}

// A redelivery R of event E, batched with companions, looks up E's pending
// claim (made by the creator A1, whose request is in flight). Before R
// records its send, A1 is refused by a gateway's 404 and releases the
// claim, so R sends nothing for E. The charge transaction of R's batch,
// which commits for the companions, must not carry E's processed_event
// row: else R's second look (processAll decides E again at once) finds E
// "already processed" and reports a duplicate that nothing charged.
// (Found by the adversarial review of 18426e2, where it failed.)
func TestClaimReleasedBeforeItsSendLeavesNoProcessedRow(t *testing.T) {
	e := newEnv(t, "secret-token")
	gw := gatewayNotFound(t).ForBilling()
	const order = 20001
	ev := event(order, 1000)

	a1Sending, refuse := make(chan struct{}), make(chan struct{})
	a1 := newService(t, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
		close(a1Sending)
		<-refuse
		return gw.Charge(ctx, ch) // 404: NotTaken, A1 created the claim: released
	}))
	a1Done := make(chan error, 1)
	go func() {
		_, err := a1.Process(billing.WithAttempt(context.Background()), ev)
		a1Done <- err
	}()
	<-a1Sending

	var once sync.Once
	in := newInjector()
	in.gate = func(_ int, name string) {
		if name == "mark sent" {
			once.Do(func() {
				close(refuse)
				if err := <-a1Done; !fault.Is(err, fault.Permanent) {
					t.Errorf("A1: %v; want permanent (the gateway's 404)", err)
				}
				if st := e.status(t, order); st != "" {
					t.Errorf("setup: A1 did not release its claim (status %q)", st)
				}
			})
		}
	}
	r := newService(t, faultDB{e.pool, in}, e.charger)
	batch := []events.OrderConfirmed{e.companion(), ev, e.companion()}
	res, errs := billing.ProcessBatch(billing.WithAttempt(context.Background()), r, batch, 1)
	t.Logf("R's batch: %+v / %v (ops %q)", res, errs, in.trace())
	t.Logf("after R: status %q, charges at the provider %d, processed_event rows %d",
		e.status(t, order), e.sim.ChargesFor(order), e.processedRows(t, ev.EventID))
	if errs[1] == nil && res[1].Outcome == billing.Duplicate && e.sim.ChargesFor(order) == 0 {
		t.Errorf("E reported as a duplicate although nothing charged it: its processed_event row was committed by the companions' transaction; claim left %q",
			e.status(t, order))
	}
	if e.processedRows(t, ev.EventID) == 1 && e.sim.ChargesFor(order) == 0 {
		t.Errorf("E has a processed_event row but no charge")
	}
}

// The same when the claim is blocked (by the completer) between a batched
// redelivery's lookup and its send: E is dead-lettered as a conflict, and
// no processed_event row of it may commit with the companions, or the
// replay the BillingLedgerClaimBlocked runbook ends in — after the
// operator released the claim — would be a duplicate that charges nothing.
func TestClaimBlockedBeforeItsSendLeavesNoProcessedRow(t *testing.T) {
	e := newEnv(t, "secret-token")
	const order = 20004
	ev := event(order, 1000)
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status, claim_token)
VALUES ($1, $2, $3, $4::numeric, $5, $5, 'pending', gen_random_uuid())`, ev.OrderID, ev.EventID, ev.CustomerID, ev.TotalAmount.String(), now); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	in := newInjector()
	in.gate = func(_ int, name string) {
		if name == "mark sent" {
			once.Do(func() { // the completer blocks the claim meanwhile
				if _, err := e.pool.Exec(context.Background(), "UPDATE charge SET status = 'blocked', last_error = 're-sent by the completer: 400' WHERE order_id = $1", order); err != nil {
					t.Error(err)
				}
			})
		}
	}
	r := newService(t, faultDB{e.pool, in}, e.charger)
	batch := []events.OrderConfirmed{e.companion(), ev, e.companion()}
	res, errs := billing.ProcessBatch(billing.WithAttempt(context.Background()), r, batch, 1)
	t.Logf("redelivery in a batch: %+v, %v; processed_event rows of E: %d", res[1], errs[1], e.processedRows(t, ev.EventID))
	// The operator: the provider has nothing under E's key; release, replay.
	if _, err := e.pool.Exec(context.Background(), "DELETE FROM charge WHERE order_id = $1 AND status = 'blocked'", order); err != nil {
		t.Fatal(err)
	}
	rres, rerr := e.svc.Process(billing.WithAttempt(context.Background()), ev)
	t.Logf("the operator's replay: %+v, %v; ledger %q; charges %d", rres, rerr, e.status(t, order), e.sim.ChargesFor(order))
	if rerr == nil && rres.Outcome == billing.Duplicate && e.sim.ChargesFor(order) == 0 {
		t.Errorf("the replay after the operator released the blocked claim is a 'duplicate' and charges nothing (claim left %q)", e.status(t, order))
	}
}
