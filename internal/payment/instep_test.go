package payment

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Keep-alive connections kept in step, from the adversarial review of the
// FastHTTP engine: each test runs against both engines. The first failed
// on FastHTTP before inStepConn (fasthttp.go): a stale 402 on an idle
// connection was taken for the next charge's answer (NotTaken for a
// request the provider then charged), and a stale 200 for the one after.

// handProvider is a raw HTTP/1.1 server: handle is called for request i on
// connection n with the request read, and writes whatever it likes to
// conn. keys records every Idempotency-Key read, with the connection it
// arrived on.
type handProvider struct {
	url  string
	mu   sync.Mutex
	keys []string
	conn []int
}

func startHand(t *testing.T, handle func(conn net.Conn, n, i int, req *http.Request)) *handProvider {
	t.Helper()
	return startHandTLS(t, nil, handle)
}

// startHandTLS is startHand over TLS when cert is set.
func startHandTLS(t *testing.T, cert *tls.Certificate, handle func(conn net.Conn, n, i int, req *http.Request)) *handProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &handProvider{url: "http://" + ln.Addr().String()}
	if cert != nil {
		p.url = "https://" + ln.Addr().String()
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for n := 0; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if cert != nil {
				conn = tls.Server(conn, &tls.Config{Certificates: []tls.Certificate{*cert}})
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
				br := bufio.NewReader(conn)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					p.mu.Lock()
					p.keys = append(p.keys, req.Header.Get("Idempotency-Key"))
					p.conn = append(p.conn, n)
					p.mu.Unlock()
					handle(conn, n, i, req)
				}
			})
		}
	})
	return p
}

func (p *handProvider) copies(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, k := range p.keys {
		if k == key {
			n++
		}
	}
	return n
}

const rawOK = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"charge_id\":\"ch_1\"}"

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
		p := startHandTLS(t, cert, func(conn net.Conn, n, i int, req *http.Request) {
			if req.Header.Get("Idempotency-Key") == declined.Load().(string) {
				_, _ = io.WriteString(conn, "HTTP/1.1 402 Payment Required\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n")
				return
			}
			_, _ = io.WriteString(conn, rawOK)
			if n == 0 && i == 0 {
				time.Sleep(50 * time.Millisecond) // a separate segment, after the client read the 200
				_, _ = io.WriteString(conn, "HTTP/1.1 402 Payment Required\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n")
			}
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

func (p *handProvider) waitCopies(key string, d time.Duration) int {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if n := p.copies(key); n > 0 {
			return n
		}
	}
	return p.copies(key)
}

func (p *handProvider) conns() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.conn...)
}

// TestHeaderValueIsNeverWrittenRaw: an Authorization callback (any
// Config.Authorization, not only FileToken) that returns a value with a
// CR LF must not put a second request on the wire. net/http refuses the
// request before dialing; fasthttp writes header values as they are.
func TestHeaderValueIsNeverWrittenRaw(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		p := startHand(t, func(conn net.Conn, n, i int, req *http.Request) {
			_, _ = io.WriteString(conn, rawOK)
		})
		smuggled := "Bearer x\r\nContent-Length: 0\r\n\r\nPOST /payments/charge HTTP/1.1\r\nHost: h\r\nIdempotency-Key: smuggled\r\nContent-Length: 0\r\n\r\n"
		c := newClient(t, p.url, func(cfg *Config) {
			cfg.Token = ""
			cfg.Authorization = func() []string { return []string{smuggled} }
		})
		_, err := c.Charge(t.Context(), testCharge())
		time.Sleep(200 * time.Millisecond)
		t.Logf("err %v keys %q", err, p.keys)
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
