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
	"github.com/billing-consumer/billing-consumer/internal/paysim"
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
// deleted it: only an operator or a foreign binary can) makes its own
// event a conflict; the other events of its batch are charged and
// recorded as usual, not dead-lettered with it.
func TestVanishedClaimIsTheOnlyConflictOfItsBatch(t *testing.T) {
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
	}
	if !fault.Is(errs[1], fault.Conflict) {
		t.Errorf("the vanished claim's event: %v; want conflict", errs[1])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil || res[i].Outcome != billing.Charged {
			t.Errorf("order %d beside the vanished claim: %+v, %v; want charged", batch[i].OrderID, res[i], errs[i])
		}
		if st := e.status(t, batch[i].OrderID); st != "charged" {
			t.Errorf("order %d: ledger status %q; want charged", batch[i].OrderID, st)
		}
	}
	if n := e.processedRows(t, victim.EventID); n != 0 {
		t.Errorf("the vanished claim's event has %d processed_event rows; want 0 (it is dead-lettered, not done)", n)
	}
}
