package payment

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// These tests try to break "not taken": NotTaken must be true only when no
// byte of the request can have reached the provider, and no engine may
// write a request twice without saying so (Error.Conns > 1). The provider
// is a raw HTTP/1.1 server whose script decides, per connection and
// request, how it ends the exchange.

// scriptAction is how the scripted provider ends one request it has read.
type scriptAction int

const (
	answer200       scriptAction = iota // 200 with a charge id, keep-alive
	answerThenFIN                       // 200 with a charge id, then close the idle connection
	resetAfterRead                      // read the request, then RST: no answer byte
	resetAfterHead                      // 200's status line and headers, then RST mid-body
	refuseAfterHead                     // 402's status line and headers, then RST mid-body
)

// startScripted starts a wireProvider, over TLS when cert is set, whose
// script returns the action for request i on connection conn (both from
// 0).
func startScripted(t *testing.T, cert *tls.Certificate, script func(conn, i int) scriptAction) *wireProvider {
	t.Helper()
	return startWire(t, cert, func(c wireConn, i int, _ *http.Request) bool {
		switch script(c.n, i) {
		case answer200:
			_, err := io.WriteString(c, rawOK)
			return err == nil
		case answerThenFIN:
			_, _ = io.WriteString(c, rawOK)
		case resetAfterRead:
			c.reset()
		case resetAfterHead:
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"charge_")
			c.reset()
		case refuseAfterHead:
			_, _ = io.WriteString(c, "HTTP/1.1 402 Payment Required\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"error\":")
			c.reset()
		}
		return false
	})
}

// secondCharge is a charge other than testCharge, for the request after
// the warm-up.
func secondCharge() Charge {
	ch := testCharge()
	ch.IdempotencyKey, ch.OrderID = "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1e", 1002
	return ch
}

// checkNotTaken checks the rule every engine must keep for an attempt
// whose request the provider read `copies` times: NotTaken without an
// answer only with no copy read, NotTaken for a refusal only with one
// copy read, and more than one copy only with Conns > 1 (net/http's
// replay, never fasthttp's). It returns the attempt's *Error, nil on
// success.
func checkNotTaken(t *testing.T, err error, copies int) *Error {
	t.Helper()
	if engineOf(t) == FastHTTP && copies > 1 {
		t.Errorf("fasthttp wrote the request %d times: it must never re-send on its own", copies)
	}
	if err == nil {
		return nil
	}
	e := mustPaymentError(t, err)
	// A refusal answering the one copy read proves the money was not
	// taken; without an answer, any copy read may have charged.
	if e.NotTaken() && (e.Status == 0 && copies > 0 || copies > 1) {
		t.Errorf("NotTaken() after the provider read %d copies: %+v (%v)", copies, e, err)
	}
	if copies > 1 && e.Conns < 2 {
		t.Errorf("the provider read %d copies but Conns = %d: a silent replay would pass for one attempt (%v)", copies, e.Conns, err)
	}
	if engineOf(t) == FastHTTP && e.Conns > 1 {
		t.Errorf("fasthttp attempt on %d connections", e.Conns)
	}
	return e
}

// TestNoAnswerAfterTheRequestLeftIsNeverNotTaken breaks the exchange after
// the request was written, on a reused keep-alive connection (where
// net/http replays and where fasthttp would, with its retries on): read
// then reset, reset after a 200's headers, and after a 402's headers (the
// refusal arrived: Permanent, NotTaken, as with net/http).
func TestNoAnswerAfterTheRequestLeftIsNeverNotTaken(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for _, tt := range []struct {
			name   string
			action scriptAction
			want   fault.Kind
		}{
			{"read then reset", resetAfterRead, fault.Transient},
			{"reset after the 200 headers", resetAfterHead, fault.Transient},
			{"reset after the 402 headers", refuseAfterHead, fault.Permanent},
		} {
			t.Run(tt.name, func(t *testing.T) {
				p := startScripted(t, nil, func(conn, i int) scriptAction {
					if conn == 0 && i == 1 {
						return tt.action
					}
					return answer200
				})
				c := newClient(t, p.url, nil)
				if _, err := c.Charge(t.Context(), testCharge()); err != nil {
					t.Fatalf("warm-up: %v", err)
				}
				ch := secondCharge()
				_, err := c.Charge(t.Context(), ch)
				copies := p.copies(ch.IdempotencyKey)
				e := checkNotTaken(t, err, copies)
				replayed := engineOf(t) == NetHTTP && tt.action == resetAfterRead
				switch {
				case replayed: // net/http re-sent it and says so
					if err != nil && e.Conns < 2 || copies != 2 {
						t.Errorf("net/http replay: %v, %d copies; want 2 copies, Conns 2 on an error", err, copies)
					}
				case e == nil:
					t.Fatalf("charge succeeded (%d copies); want %v", copies, tt.want)
				case e.Kind != tt.want || copies != 1 || e.Conns != 1:
					t.Errorf("%+v (%v), %d copies; want %v on one connection, one copy", e, err, copies, tt.want)
				case tt.want == fault.Transient && (e.NotTaken() || e.Status != 0):
					t.Errorf("%+v: want an unknown outcome", e)
				}
			})
		}
	})
}

// TestKeepAliveClosedBeforeReuseIsNotResent is the case where fasthttp,
// with its retries on, re-sends silently: the provider closes an idle
// keep-alive connection (no Connection: close), and the next charge finds
// it in the pool. fasthttp must fail the attempt as an unknown outcome on
// one connection and re-send nothing; the caller's retry then succeeds
// on a new connection. (net/http notices the closed connection, or
// replays and counts it.) The same scenario with fasthttp's retries
// switched on shows the re-send this test exists to catch.
func TestKeepAliveClosedBeforeReuseIsNotResent(t *testing.T) {
	scenario := func(t *testing.T, c *Client, p *wireProvider) (int, error) {
		t.Helper()
		if _, err := c.Charge(t.Context(), testCharge()); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
		select { // the provider has closed the warm-up's connection
		case <-p.closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the provider did not close the connection")
		}
		ch := secondCharge()
		_, err := c.Charge(t.Context(), ch)
		return p.copies(ch.IdempotencyKey), err
	}
	script := func(conn, i int) scriptAction {
		if conn == 0 {
			return answerThenFIN
		}
		return answer200
	}
	forEachClient(t, func(t *testing.T) {
		p := startScripted(t, nil, script)
		c := newClient(t, p.url, nil)
		copies, err := scenario(t, c, p)
		e := checkNotTaken(t, err, copies)
		if engineOf(t) == FastHTTP {
			if e == nil || e.Kind != fault.Transient || e.Status != 0 || e.Conns != 1 || e.NotTaken() || copies != 0 {
				t.Fatalf("fasthttp on a closed keep-alive connection: %v, %d copies; want Transient, one connection, not NotTaken, nothing re-sent", err, copies)
			}
			if _, err := c.Charge(t.Context(), secondCharge()); err != nil || p.copies(secondCharge().IdempotencyKey) != 1 {
				t.Errorf("the caller's retry: %v, %d copies; want success, one copy", err, p.copies(secondCharge().IdempotencyKey))
			}
		} else if err != nil || copies != 1 {
			t.Logf("net/http: %v, %d copies", err, copies)
		}
	})
	t.Run("fasthttp with its retries on re-sends", func(t *testing.T) {
		p := startScripted(t, nil, script)
		c, err := New(Config{Engine: FastHTTP, BaseURL: p.url, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.CloseIdleConnections)
		c.fast.hc.MaxIdemponentCallAttempts = 2
		c.fast.hc.RetryIfErr = func(*fasthttp.Request, int, error) (bool, bool) { return false, true }
		copies, err := scenario(t, c, p)
		if err != nil || copies != 1 {
			t.Errorf("with retries on: %v, %d copies; want fasthttp's silent re-send to succeed (else this test cannot catch one)", err, copies)
		}
	})
}

// TestTLSHandshakeRefusedIsNotTaken: a provider whose certificate we
// refuse never gets a byte of the request: Systemic, NotTaken, no
// connection counted, and nothing read. A provider that drops the
// connection during the handshake is only an unknown outcome (Transient):
// we cannot tell it apart from a TLS peer that read something.
func TestTLSHandshakeRefusedIsNotTaken(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		untrusted := selfSigned(t)
		p := startScripted(t, &untrusted, func(int, int) scriptAction { return answer200 })
		c := newClient(t, p.url, func(cfg *Config) { cfg.TLS = &tls.Config{ServerName: "example.com"} })
		_, err := c.Charge(t.Context(), testCharge())
		e := checkNotTaken(t, err, p.copies(testCharge().IdempotencyKey))
		if e == nil || e.Kind != fault.Systemic || !e.NotTaken() || e.Conns != 0 {
			t.Errorf("untrusted certificate: %+v (%v); want Systemic, NotTaken, Conns 0", e, err)
		}

		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = conn.Read(make([]byte, 1)) // the ClientHello's first byte
				_ = conn.Close()
			}
		}()
		c = newClient(t, "https://"+ln.Addr().String(), nil)
		_, err = c.Charge(t.Context(), testCharge())
		if e := mustPaymentError(t, err); e.Kind != fault.Transient || e.NotTaken() {
			t.Errorf("handshake dropped: %+v (%v); want Transient, not NotTaken", e, err)
		}
	})
}

// TestConnectionRefusedCountsNoConnection: nothing listening is Transient
// (the outage detection pauses), with no connection had.
func TestConnectionRefusedCountsNoConnection(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		c := newClient(t, "http://"+addr, nil)
		_, err = c.Charge(t.Context(), testCharge())
		if e := mustPaymentError(t, err); e.Kind != fault.Transient || e.Conns != 0 || e.NotTaken() {
			t.Errorf("%+v (%v); want Transient, Conns 0, not NotTaken", e, err)
		}
	})
}

// TestClientCertificate: a provider requiring a client certificate gets
// the one in Config.TLS; without it the attempt fails and is never
// NotTaken (under TLS 1.3 the refusal comes after the request was
// written).
func TestClientCertificate(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		clientCert := selfSigned(t)
		leaf, err := x509.ParseCertificate(clientCert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		clients := x509.NewCertPool()
		clients.AddCert(leaf)
		var mu sync.Mutex
		var hits int
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits++
			mu.Unlock()
			_, _ = io.WriteString(w, `{"charge_id":"ch_mtls"}`)
		}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake logs
		srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clients}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		roots := x509.NewCertPool()
		roots.AddCert(srv.Certificate())
		c := newClient(t, srv.URL, func(cfg *Config) {
			cfg.TLS = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}}
		})
		if res, err := c.Charge(t.Context(), testCharge()); err != nil || res.ChargeID != "ch_mtls" {
			t.Fatalf("with the client certificate: %+v, %v", res, err)
		}
		c = newClient(t, srv.URL, func(cfg *Config) { cfg.TLS = &tls.Config{RootCAs: roots} })
		_, err = c.Charge(t.Context(), testCharge())
		if e := mustPaymentError(t, err); e.NotTaken() {
			t.Errorf("without a client certificate: %+v (%v) says NotTaken", e, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if hits != 1 {
			t.Errorf("%d requests reached the handler, want 1", hits)
		}
	})
}

// TestFastHTTPNeverRetries pins the HostClient settings the no-replay
// rule rests on, and that a proxy is refused rather than bypassed.
func TestFastHTTPNeverRetries(t *testing.T) {
	c, err := New(Config{Engine: FastHTTP, BaseURL: "https://pay.example.com", Timeout: 3 * time.Second, MaxConns: 32})
	if err != nil {
		t.Fatal(err)
	}
	hc := c.fast.hc
	if hc.MaxIdemponentCallAttempts != 1 || hc.RetryIfErr == nil {
		t.Fatalf("MaxIdemponentCallAttempts %d, RetryIfErr set %v; want 1 and set", hc.MaxIdemponentCallAttempts, hc.RetryIfErr != nil)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	for _, e := range []error{io.EOF, fasthttp.ErrConnectionClosed, fasthttp.ErrTimeout, errors.New("reset")} {
		if reset, retry := hc.RetryIfErr(req, 1, e); retry || reset {
			t.Errorf("RetryIfErr(%v) = %v, %v; want no retry", e, reset, retry)
		}
	}
	if hc.MaxConns != 32 || hc.Addr != "pay.example.com:443" || !hc.IsTLS || hc.MaxConnWaitTimeout != 3*time.Second {
		t.Errorf("HostClient %d conns, addr %q, TLS %v, wait %v", hc.MaxConns, hc.Addr, hc.IsTLS, hc.MaxConnWaitTimeout)
	}
	proxy := func(*http.Request) (*url.URL, error) { return url.Parse("http://proxy.example.com:3128") }
	if _, err := New(Config{Engine: FastHTTP, BaseURL: "https://pay.example.com", Timeout: time.Second, Proxy: proxy}); err == nil {
		t.Error("fasthttp accepted a proxy it would bypass")
	}
	direct := func(*http.Request) (*url.URL, error) { return nil, nil }
	if _, err := New(Config{Engine: FastHTTP, BaseURL: "https://pay.example.com", Timeout: time.Second, Proxy: direct}); err != nil {
		t.Errorf("no proxy selected: %v", err)
	}
	if _, err := New(Config{Engine: "curl", BaseURL: "https://pay.example.com", Timeout: time.Second}); err == nil {
		t.Error("an unknown engine was accepted")
	}
}
