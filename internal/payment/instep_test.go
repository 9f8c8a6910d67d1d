package payment

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Keep-alive connections kept in step, from the adversarial review of the
// FastHTTP engine: each test runs against both engines. The first failed
// on FastHTTP before inStepConn (fasthttp.go): a stale 402 on an idle
// connection was taken for the next charge's answer (NotTaken for a
// request the provider then charged), and a stale 200 for the one after.

// TestStaleBytesOnAnIdleConnectionAreNotTheAnswer: after answering
// the warm-up, the provider (or a middlebox in front of it) writes one
// more, unsolicited answer on the idle keep-alive connection: a 402. The
// next charge is a different order; the provider reads it and charges it
// (answers 200). The client must not take the stale 402 for this charge's
// answer: that would be NotTaken for a request the provider read and
// charged, and billing would release the claim (a double charge).
//
// net/http reads idle connections in the background and drops one that
// sends bytes unasked ("Unsolicited response received on idle HTTP
// channel"), so the charge goes out on a new connection. fasthttp has no
// reader on an idle connection: the stale bytes wait in the socket and are
// parsed as the next request's answer.
func TestStaleBytesOnAnIdleConnectionAreNotTheAnswer(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for _, useTLS := range []bool{false, true} {
			t.Run(map[bool]string{false: "http", true: "https"}[useTLS], func(t *testing.T) { staleBytesScenario(t, useTLS) })
		}
	})
}

func staleBytesScenario(t *testing.T, useTLS bool) {
	{
		var cert *tls.Certificate
		var mutate func(*Config)
		if useTLS {
			c := selfSigned(t)
			cert = &c
			leaf, err := x509.ParseCertificate(c.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(leaf)
			mutate = func(cfg *Config) { cfg.TLS = &tls.Config{RootCAs: roots, ServerName: "example.com"} }
		}
		var declined atomic.Value
		declined.Store("")
		p := startWire(t, cert, func(c wireConn, i int, req *http.Request) bool {
			if req.Header.Get("Idempotency-Key") == declined.Load().(string) {
				_, _ = io.WriteString(c, "HTTP/1.1 402 Payment Required\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n")
				return true
			}
			_, _ = io.WriteString(c, rawOK)
			if c.n == 0 && i == 0 {
				time.Sleep(50 * time.Millisecond) // a separate segment, after the client read the 200
				_, _ = io.WriteString(c, "HTTP/1.1 402 Payment Required\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n")
			}
			return true
		})
		c := newClient(t, p.url, mutate)
		if _, err := c.Charge(t.Context(), testCharge()); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
		ch := secondCharge()
		res, err := c.Charge(t.Context(), ch)
		// The stale answer may be parsed before the provider has even read
		// the request: wait for it to read (and charge) it.
		copies := p.waitCopies(ch.IdempotencyKey, time.Second)
		t.Logf("second charge: res %+v, err %v; provider read it %d times, on connections %v", res, err, copies, p.conns())
		if err != nil {
			e := mustPaymentError(t, err)
			if copies > 0 && e.NotTaken() {
				t.Errorf("the provider read and charged the request (%d copies, answered 200), but the client reports %+v, NotTaken: a stale answer passed for this charge's refusal (billing releases the claim: double charge)", copies, e)
			}
		} else if res.ChargeID != "ch_1" || copies != 1 {
			t.Errorf("%+v, %d copies", res, copies)
		}
		// The provider's real 200 for the second charge is now the stale
		// answer: a third order, which the provider declines, must not be
		// reported charged with another order's charge id.
		third := secondCharge()
		third.IdempotencyKey, third.OrderID = "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1f", 1003
		declined.Store(third.IdempotencyKey)
		res, err = c.Charge(t.Context(), third)
		copies = p.waitCopies(third.IdempotencyKey, time.Second)
		t.Logf("third charge (declined by the provider): res %+v, err %v, %d copies", res, err, copies)
		if err == nil {
			t.Errorf("the provider declined order 1003 (402) but the client reports it charged: %+v (another request's answer)", res)
		}
	}
}

// TestHeaderValueIsNeverWrittenRaw: an Authorization callback (any
// Config.Authorization, not only FileToken) that returns a value with a
// CR LF must not put a second request on the wire. net/http refuses the
// request before dialing; fasthttp writes header values as they are.
func TestHeaderValueIsNeverWrittenRaw(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		p := startWire(t, nil, func(c wireConn, i int, req *http.Request) bool {
			_, err := io.WriteString(c, rawOK)
			return err == nil
		})
		smuggled := "Bearer x\r\nContent-Length: 0\r\n\r\nPOST /payments/charge HTTP/1.1\r\nHost: h\r\nIdempotency-Key: smuggled\r\nContent-Length: 0\r\n\r\n"
		c := newClient(t, p.url, func(cfg *Config) {
			cfg.Token = ""
			cfg.Authorization = func() []string { return []string{smuggled} }
		})
		_, err := c.Charge(t.Context(), testCharge())
		time.Sleep(200 * time.Millisecond)
		t.Logf("err %v, %d requests read", err, len(p.conns()))
		if n := p.copies("smuggled"); n > 0 {
			t.Errorf("a header value with CR LF put %d more request(s) on the wire (Charge: %v)", n, err)
		}
		if err != nil {
			if e := mustPaymentError(t, err); e.NotTaken() && p.copies(testCharge().IdempotencyKey) > 0 {
				t.Errorf("NotTaken after the request was read: %+v", e)
			}
		}
	})
}

// TestChunkedAnswersKeepTheConnectionInStep: a well-behaved Go
// provider answering in chunks (flushed, the last chunk and trailers
// late) must leave the pooled connection in step: the next charge gets
// its own answer.
func TestChunkedAnswersKeepTheConnectionInStep(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for _, trailer := range []bool{false, true} {
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if trailer {
					w.Header().Set("Trailer", "X-Charge-Trailer")
				}
				key := r.Header.Get("Idempotency-Key")
				if strings.HasSuffix(key, "e") {
					w.WriteHeader(http.StatusPaymentRequired)
				}
				_, _ = io.WriteString(w, `{"charge_id":"ch_`+key[len(key)-4:]+`"}`)
				w.(http.Flusher).Flush()
				time.Sleep(30 * time.Millisecond)
				if trailer {
					w.Header().Set("X-Charge-Trailer", "yes")
				}
			}))
			c := newClient(t, srv.URL, nil)
			res, err := c.Charge(t.Context(), testCharge())
			if err != nil || res.ChargeID != "ch_0c1d" {
				t.Fatalf("trailer %v: first: %+v %v", trailer, res, err)
			}
			_, err = c.Charge(t.Context(), secondCharge())
			if e := mustPaymentError(t, err); e.Status != http.StatusPaymentRequired {
				t.Errorf("trailer %v: second: %v", trailer, err)
			}
			res, err = c.Charge(t.Context(), testCharge())
			if err != nil || res.ChargeID != "ch_0c1d" {
				t.Errorf("trailer %v: third: %+v %v", trailer, res, err)
			}
		}
	})
}
