package payment

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// hangingServer accepts charges and never answers until the client goes
// away or the test ends. got receives one value per request arrived.
func hangingServer(t *testing.T) (url string, got <-chan struct{}) {
	t.Helper()
	arrived := make(chan struct{}, 16)
	done := make(chan struct{})
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(func() { close(done) }) // runs before srv.Close
	return srv.URL, arrived
}

func TestChargeTimeout(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		url, _ := hangingServer(t)
		var observed string
		c := newClient(t, url, func(cfg *Config) {
			cfg.Timeout = 50 * time.Millisecond
			cfg.Observe = func(code string, _ time.Duration) { observed = code }
		})
		_, err := c.Charge(t.Context(), testCharge())
		e := mustPaymentError(t, err)
		if e.Kind != fault.Transient || e.Status != 0 {
			t.Errorf("timeout: %+v, want Transient without status", e)
		}
		if errors.Is(err, context.Canceled) {
			t.Error("an attempt timeout must not look like the caller's cancellation")
		}
		if observed != "error" {
			t.Errorf("observed %q, want error", observed)
		}
	})
}

func TestChargeCanceled(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		url, arrived := hangingServer(t)
		c := newClient(t, url, nil)

		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			<-arrived
			cancel()
		}()
		_, err := c.Charge(ctx, testCharge())
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancel in flight: %v, want context.Canceled", err)
		}
		if e := mustPaymentError(t, err); e.Kind != fault.Transient {
			t.Errorf("cancel in flight: kind %v, want Transient (outcome unknown)", e.Kind)
		}

		_, err = c.Charge(ctx, testCharge()) // already cancelled
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled before: %v, want context.Canceled", err)
		}

		ctx, cancelDeadline := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancelDeadline()
		_, err = c.Charge(ctx, testCharge())
		if !errors.Is(err, context.DeadlineExceeded) || fault.KindOf(err) != fault.Transient {
			t.Errorf("caller deadline: %v, want DeadlineExceeded, Transient", err)
		}
	})
}

// TestChargeDropped covers answers lost on the wire: the provider may have
// charged, so the error must be Transient and carry no status.
func TestChargeDropped(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		tests := map[string]string{
			"closed before answering": "",
			"partial status line":     "HTTP/1.1 200 O",
			"partial headers":         "HTTP/1.1 200 OK\r\nContent-Type: appl",
			"truncated 200 body":      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"charge_id\":",
			"reset":                   "reset",
		}
		for name, raw := range tests {
			t.Run(name, func(t *testing.T) {
				srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.ReadAll(r.Body)
					conn, buf, err := w.(http.Hijacker).Hijack()
					if err != nil {
						t.Errorf("hijack: %v", err)
						return
					}
					defer conn.Close()
					if raw == "reset" {
						_ = conn.(*net.TCPConn).SetLinger(0)
						return
					}
					_, _ = buf.WriteString(raw)
					_ = buf.Flush()
				}))
				var observed string
				c := newClient(t, srv.URL, func(cfg *Config) {
					cfg.Observe = func(code string, _ time.Duration) { observed = code }
				})
				_, err := c.Charge(t.Context(), testCharge())
				e := mustPaymentError(t, err)
				if e.Kind != fault.Transient || e.Status != 0 || e.Err == nil {
					t.Errorf("%+v, want Transient, no status, a cause", e)
				}
				if observed != "error" {
					t.Errorf("observed %q, want error", observed)
				}
			})
		}
	})
}

func TestChargeConnectionRefused(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close() // nothing listens there any more
		c := newClient(t, "http://"+addr, nil)
		_, err = c.Charge(t.Context(), testCharge())
		if e := mustPaymentError(t, err); e.Kind != fault.Transient || e.Status != 0 {
			t.Errorf("%+v, want Transient without status", e)
		}
	})
}

// A request still waiting for a connection when the caller's deadline
// passes is never sent, not even once a connection frees up (billing
// records that deadline before it sends, SPEC §11 I5): one connection,
// held by a first request; the second gives up at its deadline; after the
// first answers, a third is sent and answered, and the provider has seen
// two requests, not three.
func TestNoRequestLeavesAfterTheCallersDeadline(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		var arrivals atomic.Int32
		held, free := make(chan struct{}), make(chan struct{})
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			if arrivals.Add(1) == 1 {
				close(held)
				<-free
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"charge_id":"ch_1"}`)
		}))
		c := newClient(t, srv.URL, func(cfg *Config) { cfg.MaxConns = 1 })
		first := make(chan error, 1)
		go func() {
			_, err := c.Charge(t.Context(), testCharge())
			first <- err
		}()
		<-held
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if _, err := c.Charge(ctx, testCharge()); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second request, waiting for the connection: %v; want DeadlineExceeded", err)
		}
		close(free)
		if err := <-first; err != nil {
			t.Fatalf("first request: %v", err)
		}
		if _, err := c.Charge(t.Context(), testCharge()); err != nil {
			t.Fatalf("third request: %v", err)
		}
		if n := arrivals.Load(); n != 2 {
			t.Fatalf("the provider saw %d requests, want 2: the second was sent after its caller's deadline", n)
		}
	})
}
