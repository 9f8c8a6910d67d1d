package billing_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// Faults of the charge path around the claim: a context ended between the
// answer and the record, a forged body, a release racing a claim, a
// connection gone silent.

// A shutdown (drain deadline, SIGTERM) that cancels the context between the
// provider's 2xx and the ledger write must not lose the charge: the record
// and the commit run on a context that outlives it.
func TestChargeTakenIsRecordedWhenTheContextEnds(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		svc := e.biller(t, k, e.pool, chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			r, err := e.charger.Charge(ctx, ch)
			if isCompanion(ch.IdempotencyKey) {
				return r, err
			}
			cancel() // SIGTERM arrives just as the provider's answer does
			return r, err
		}))
		ev := event(8001, 1500)
		res, err := svc.Process(ctx, ev)
		if err != nil || res.Outcome != billing.Charged {
			t.Fatalf("Process = %+v, %v; want charged", res, err)
		}
		if st := e.status(t, 8001); st != "charged" || e.processedRows(t, ev.EventID) != 1 {
			t.Fatalf("ledger status %q, processed rows %d; want charged, 1", st, e.processedRows(t, ev.EventID))
		}
	})
}

// An event whose event_id matches a pending claim but whose amount differs
// is a conflict, and nothing is charged with its body.
func TestSameEventIDWithAnotherBodyIsConflict(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		b := e.billerOf(t, k, e.svc)
		ev := event(8002, 1000)
		e.sim.SetFaults(paysim.Faults{ErrorRate: 1}) // 500, nothing taken: the claim stays pending
		if _, err := b.Process(context.Background(), ev); !fault.Is(err, fault.Transient) {
			t.Fatalf("first attempt: %v; want transient", err)
		}
		e.sim.SetFaults(paysim.Faults{})
		forged := ev
		forged.TotalAmount = 99900
		if _, err := b.Process(context.Background(), forged); !fault.Is(err, fault.Conflict) {
			t.Fatalf("same event_id, other amount: %v; want conflict", err)
		}
		if n := e.sim.ChargesFor(8002); n != 0 {
			t.Fatalf("provider took %d charges with the other body, want 0", n)
		}
		if res, err := b.Process(context.Background(), ev); err != nil || res.Outcome != billing.Charged {
			t.Fatalf("the real event: %+v, %v; want charged", res, err)
		}
		for _, c := range e.sim.Charges() {
			if c.OrderID == 8002 && c.Amount != "10.00" {
				t.Fatalf("charged %s, want 10.00", c.Amount)
			}
		}
	})
}

// A claim that conflicts, then finds no row because its owner released it
// in between, is claimed again — not dead-lettered as a conflict.
func TestClaimReleasedMeanwhileIsClaimedAgain(t *testing.T) {
	forEachBiller(t, func(t *testing.T, k billerKind) {
		e := newEnv(t, "secret-token")
		first, second := event(8003, 700), event(8003, 700)
		e.sim.SetFaults(paysim.Faults{ErrorRate: 1})
		if _, err := e.svc.Process(context.Background(), first); !fault.Is(err, fault.Transient) {
			t.Fatalf("first: %v; want transient (claim pending)", err)
		}
		e.sim.SetFaults(paysim.Faults{})
		in := newInjector()
		in.gate = func(_ int, name string) {
			if name == "ledger lookup" { // the owner is refused and releases, just now
				if _, err := e.pool.Exec(context.Background(), "DELETE FROM charge WHERE order_id = 8003"); err != nil {
					t.Error(err)
				}
			}
		}
		svc := e.biller(t, k, faultDB{e.pool, in}, e.charger)
		res, err := svc.Process(context.Background(), second)
		if err != nil || res.Outcome != billing.Charged {
			t.Fatalf("second after the release: %+v, %v; want charged (ops %q)", res, err, in.trace())
		}
	})
}

// A database connection that silently stops answering (packets dropped,
// nothing closed) fails the attempt within BILLING_DB_TIMEOUT instead of
// hanging the handler past the group's session timeout; the claim stays
// pending and the retry, on a working connection, settles it.
func TestSilentConnectionFailsWithinTheDeadline(t *testing.T) {
	e := newEnv(t, "secret-token")
	cc := e.pool.Config().ConnConfig
	proxy := newFreezingProxy(t, net.JoinHostPort(cc.Host, fmt.Sprint(cc.Port)))
	u, err := url.Parse(e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy.addr
	pool := pgtest.Open(t, u.String())
	svc, err := billing.New(billing.Config{Store: postgres.NewStoreOn(pool), Group: group, Now: func() time.Time { return now },
		Logger: discard(), DBTimeout: time.Second,
		Charger: chargerFunc(func(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
			r, err := e.charger.Charge(ctx, ch)
			proxy.freeze() // the network path to Postgres goes silent
			return r, err
		})})
	if err != nil {
		t.Fatal(err)
	}
	ev := event(8004, 2500)
	done := make(chan error, 1)
	go func() { _, err := svc.Process(context.Background(), ev); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Process succeeded through a silent connection")
		}
		t.Logf("failed as it must: %v", err)
	case <-time.After(30 * time.Second): // a hang detector, not a timing assertion
		proxy.cut() // so that the pool can close
		t.Fatal("Process still hangs on the silent connection after 30 s (DBTimeout 1 s)")
	}
	if st := e.status(t, 8004); st != "pending" {
		t.Fatalf("ledger status %q after the failed record, want pending", st)
	}
	// Until the server drops the dead session, its transaction holds the
	// event's processed_event row; then the retry goes through.
	proxy.cut()
	if res, err := e.svc.Process(context.Background(), ev); err != nil || res.Outcome != billing.Charged {
		t.Fatalf("retry: %+v, %v; want charged (replayed)", res, err)
	}
	e.assertChargedOnce(t, ev)
}

// freezingProxy forwards TCP to Postgres until freeze, after which it
// stops moving bytes on every connection without closing any.
type freezingProxy struct {
	addr string
	// cut closes every frozen connection, as the server does in the end
	// (TCP keepalive, idle_in_transaction_session_timeout).
	cut    func()
	mu     sync.Mutex
	frozen chan struct{}
}

func newFreezingProxy(t *testing.T, target string) *freezingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{addr: ln.Addr().String(), frozen: make(chan struct{})}
	closed := make(chan struct{})
	var open []net.Conn
	p.cut = sync.OnceFunc(func() {
		close(closed)
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range open {
			_ = c.Close()
		}
	})
	var conns sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); p.freeze(); p.cut(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			open = append(open, c, s)
			p.mu.Unlock()
			conns.Add(2)
			pipe := func(dst, src net.Conn) {
				defer conns.Done()
				defer dst.Close()
				defer src.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					select {
					case <-p.frozen:
						<-closed // drop what came and hold the connection open: silence
						return
					default:
					}
					if n > 0 {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err == io.EOF || err != nil {
						return
					}
				}
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return p
}

func (p *freezingProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.frozen:
	default:
		close(p.frozen)
	}
}
