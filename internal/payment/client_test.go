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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

const testToken = "sk_test_s3cr3t-T0KEN"

// testCharge returns the charge of the SPEC example event.
func testCharge() Charge {
	return Charge{IdempotencyKey: "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1d", OrderID: 1001, CustomerID: 42, Amount: 9990}
}

// serve starts h on an httptest.Server closed at the end of the test.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// engines are the two clients behind billing's Charger port: every
// contract test of the client runs against both (forEachClient).
var engines = []Engine{NetHTTP, FastHTTP}

// forEachClient runs test once per engine, as a subtest named after it;
// newClient inside it builds that engine's client.
func forEachClient(t *testing.T, test func(t *testing.T)) {
	t.Helper()
	for _, e := range engines {
		t.Run(string(e), test)
	}
}

// engineOf returns the engine of the forEachClient subtest that t is (or
// runs inside of).
func engineOf(t *testing.T) Engine {
	t.Helper()
	for _, part := range strings.Split(t.Name(), "/") {
		for _, e := range engines {
			if part == string(e) {
				return e
			}
		}
	}
	t.Fatalf("%s: newClient outside forEachClient", t.Name())
	return ""
}

// newClient builds a Client of the engine under test (engineOf) for
// baseURL with a 5s timeout and the test token, after mutate adjusts the
// config.
func newClient(t *testing.T, baseURL string, mutate func(*Config)) *Client {
	t.Helper()
	cfg := Config{Engine: engineOf(t), BaseURL: baseURL, Token: testToken, Timeout: 5 * time.Second}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// mustPaymentError checks that err is a *Error of the same kind as its
// fault kind and that it does not leak the token.
func mustPaymentError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) carries no *payment.Error", err, err)
	}
	if fault.KindOf(err) != e.Kind {
		t.Errorf("fault.KindOf = %v, *Error.Kind = %v", fault.KindOf(err), e.Kind)
	}
	for _, s := range []string{err.Error(), e.Error()} {
		if strings.Contains(s, testToken) {
			t.Errorf("error leaks the token: %s", s)
		}
	}
	return e
}

func TestNewValidates(t *testing.T) {
	bad := map[string]Config{
		"empty URL":         {Timeout: time.Second},
		"relative URL":      {BaseURL: "/payments", Timeout: time.Second},
		"no scheme":         {BaseURL: "pay.example.com", Timeout: time.Second},
		"ftp":               {BaseURL: "ftp://pay.example.com", Timeout: time.Second},
		"no host":           {BaseURL: "http:///x", Timeout: time.Second},
		"opaque":            {BaseURL: "http:pay.example.com", Timeout: time.Second},
		"credentials":       {BaseURL: "https://user:hunter2@pay.example.com", Timeout: time.Second},
		"query":             {BaseURL: "https://pay.example.com/?a=1", Timeout: time.Second},
		"fragment":          {BaseURL: "https://pay.example.com/#f", Timeout: time.Second},
		"unparsable":        {BaseURL: "https://pay.example.com:hunter2/", Timeout: time.Second},
		"zero timeout":      {BaseURL: "https://pay.example.com"},
		"negative timeout":  {BaseURL: "https://pay.example.com", Timeout: -time.Second},
		"negative maxconns": {BaseURL: "https://pay.example.com", Timeout: time.Second, MaxConns: -1},
		"token with CRLF":   {BaseURL: "https://pay.example.com", Timeout: time.Second, Token: "hunter2\r\nX: y"},
		"token with space":  {BaseURL: "https://pay.example.com", Timeout: time.Second, Token: "hunter2 x"},
		"TLS 1.1":           {BaseURL: "https://pay.example.com", Timeout: time.Second, TLS: &tls.Config{MinVersion: tls.VersionTLS11}},
	}
	for name, cfg := range bad {
		_, err := New(cfg)
		if err == nil {
			t.Errorf("%s: New() = nil error", name)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error leaks a secret: %v", name, err)
		}
	}

	tlsCfg := &tls.Config{ServerName: "pay.example.com"}
	for base, want := range map[string]string{
		"http://pay.example.com":          "http://pay.example.com/payments/charge",
		"https://pay.example.com/":        "https://pay.example.com/payments/charge",
		"https://pay.example.com/v1":      "https://pay.example.com/v1/payments/charge",
		"https://pay.example.com/v1/":     "https://pay.example.com/v1/payments/charge",
		"HTTPS://pay.example.com:8443/v1": "https://pay.example.com:8443/v1/payments/charge",
	} {
		c, err := New(Config{BaseURL: base, Timeout: time.Second, TLS: tlsCfg})
		if err != nil {
			t.Errorf("New(%q): %v", base, err)
			continue
		}
		if c.template.URL.String() != want {
			t.Errorf("New(%q) endpoint %q, want %q", base, c.template.URL.String(), want)
		}
		if tr := c.http.Transport.(*http.Transport); strings.HasPrefix(want, "https") {
			if tr.TLSClientConfig.MinVersion != tls.VersionTLS12 || tr.TLSClientConfig == tlsCfg {
				t.Errorf("New(%q): TLS config not a TLS1.2+ copy", base)
			}
		}
	}
	if tlsCfg.MinVersion != 0 {
		t.Error("New modified the caller's TLS config")
	}
}

func TestNewTransport(t *testing.T) {
	t.Run(string(NetHTTP), testNewTransport)
}

func testNewTransport(t *testing.T) {
	c := newClient(t, "http://pay.example.com", func(cfg *Config) { cfg.MaxConns = 32; cfg.Timeout = 3 * time.Second })
	tr := c.http.Transport.(*http.Transport)
	if tr.MaxConnsPerHost != 32 || tr.MaxIdleConnsPerHost != 32 || tr.MaxIdleConns != 32 {
		t.Errorf("pool sized %d/%d/%d, want 32", tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost, tr.MaxIdleConns)
	}
	if tr.TLSHandshakeTimeout != 3*time.Second || tr.DialContext == nil {
		t.Errorf("connect timeouts not set: TLS %v", tr.TLSHandshakeTimeout)
	}
	// The attempt's context deadline is the one per-request timer; it
	// covers the headers (TestChargeTimeout) and the body
	// (TestSlowBodyThenRetryChargesOnce).
	if tr.ResponseHeaderTimeout != 0 || c.http.Timeout != 0 {
		t.Errorf("a second per-request deadline: header %v, client %v", tr.ResponseHeaderTimeout, c.http.Timeout)
	}
	c = newClient(t, "http://pay.example.com", nil)
	if tr := c.http.Transport.(*http.Transport); tr.MaxConnsPerHost != defaultMaxConns {
		t.Errorf("default MaxConnsPerHost %d, want %d", tr.MaxConnsPerHost, defaultMaxConns)
	}
}

func TestChargeRequest(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		type seen struct {
			method, path, body string
			header             http.Header
		}
		var mu sync.Mutex
		var got []seen
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got = append(got, seen{r.Method, r.URL.Path, string(b), r.Header.Clone()})
			mu.Unlock()
			_, _ = io.WriteString(w, `{"charge_id":"ch_1"}`)
		}))

		withToken := newClient(t, srv.URL+"/v1/", nil)
		noToken := newClient(t, srv.URL+"/v1", func(c *Config) { c.Token = "" })
		for _, c := range []*Client{withToken, withToken, noToken} {
			if _, err := c.Charge(t.Context(), testCharge()); err != nil {
				t.Fatalf("Charge: %v", err)
			}
		}
		const wantBody = `{"order_id":1001,"customer_id":42,"amount":"99.90"}`
		for i, s := range got {
			if s.method != http.MethodPost || s.path != "/v1/payments/charge" {
				t.Errorf("request %d: %s %s", i, s.method, s.path)
			}
			if s.body != wantBody {
				t.Errorf("request %d: body %s, want %s", i, s.body, wantBody)
			}
			if ct := s.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("request %d: Content-Type %q", i, ct)
			}
			if k := s.header.Values("Idempotency-Key"); len(k) != 1 || k[0] != testCharge().IdempotencyKey {
				t.Errorf("request %d: Idempotency-Key %q", i, k)
			}
			wantAuth := "Bearer " + testToken
			if i == 2 {
				wantAuth = ""
			}
			if a := s.header.Get("Authorization"); a != wantAuth {
				t.Errorf("request %d: Authorization %q, want %q", i, a, wantAuth)
			}
		}
		if len(got) != 3 {
			t.Fatalf("server saw %d requests, want 3", len(got))
		}
	})
}

func TestChargeInvalidSendsNothing(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		var hits atomic.Int32
		srv := serve(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
		c := newClient(t, srv.URL, nil)
		bad := testCharge()
		bad.Amount = 0
		_, err := c.Charge(t.Context(), bad)
		if e := mustPaymentError(t, err); e.Kind != fault.Invalid || e.Status != 0 {
			t.Errorf("error %+v, want Invalid without status", e)
		}
		if hits.Load() != 0 {
			t.Error("an invalid charge reached the provider")
		}
	})
}

func TestChargeTLS(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.TLS == nil || r.TLS.Version < tls.VersionTLS12 {
				w.WriteHeader(http.StatusUpgradeRequired)
				return
			}
			_, _ = io.WriteString(w, `{"charge_id":"ch_tls"}`)
		}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted case logs a handshake error
		srv.StartTLS()
		t.Cleanup(srv.Close)
		roots := x509.NewCertPool()
		roots.AddCert(srv.Certificate())

		c := newClient(t, srv.URL, func(cfg *Config) { cfg.TLS = &tls.Config{RootCAs: roots} })
		res, err := c.Charge(t.Context(), testCharge())
		if err != nil || res.ChargeID != "ch_tls" {
			t.Fatalf("Charge over TLS = %+v, %v", res, err)
		}

		// Without the test CA the server is untrusted: nothing is sent, and it
		// is Systemic (a pause, as for a 401), not an event's fault.
		c = newClient(t, srv.URL, nil)
		_, err = c.Charge(t.Context(), testCharge())
		if e := mustPaymentError(t, err); e.Kind != fault.Systemic || e.Status != 0 {
			t.Errorf("untrusted server: %+v", e)
		}

		// A plain HTTP server at an https URL: its first record is not
		// TLS, so nothing was sent either, and it is Systemic too.
		plain := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		c = newClient(t, strings.Replace(plain.URL, "http://", "https://", 1), nil)
		_, err = c.Charge(t.Context(), testCharge())
		if e := mustPaymentError(t, err); e.Kind != fault.Systemic || e.Status != 0 {
			t.Errorf("HTTP server at an https URL: %+v", e)
		}
	})
}

func TestChargeObserve(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		status := http.StatusOK
		var statusMu sync.Mutex
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			statusMu.Lock()
			defer statusMu.Unlock()
			w.WriteHeader(status)
		}))
		var mu sync.Mutex
		var codes []string
		c := newClient(t, srv.URL, func(cfg *Config) {
			cfg.Observe = func(code string, elapsed time.Duration) {
				if elapsed <= 0 {
					t.Errorf("elapsed %v", elapsed)
				}
				mu.Lock()
				codes = append(codes, code)
				mu.Unlock()
			}
		})
		for _, s := range []int{200, 503, 422} {
			statusMu.Lock()
			status = s
			statusMu.Unlock()
			_, _ = c.Charge(t.Context(), testCharge())
		}
		srv.Close() // connection refused from now on
		_, _ = c.Charge(t.Context(), testCharge())
		invalid := testCharge()
		invalid.OrderID = 0
		_, _ = c.Charge(t.Context(), invalid) // not an attempt: not observed

		mu.Lock()
		defer mu.Unlock()
		if got, want := strings.Join(codes, ","), "200,503,422,error"; got != want {
			t.Errorf("observed %s, want %s", got, want)
		}
	})
}

// TestChargeConcurrentPool checks that concurrent calls share a pool capped
// at MaxConns connections.
func TestChargeConcurrentPool(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		const maxConns, calls = 4, 24
		var conns, active, peak atomic.Int32
		release := make(chan struct{})
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := active.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-release
			active.Add(-1)
			_, _ = io.WriteString(w, `{"charge_id":"ch_1"}`)
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		var releaseOnce sync.Once
		unblock := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(unblock) // runs before srv.Close even if the test fails early
		c := newClient(t, srv.URL, func(cfg *Config) { cfg.MaxConns = maxConns })

		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for i := range calls {
			ch := testCharge()
			ch.IdempotencyKey = "key-" + string(rune('a'+i))
			wg.Go(func() {
				if _, err := c.Charge(t.Context(), ch); err != nil {
					errs <- err
				}
			})
		}
		poll.Until(t, 10*time.Second, "every connection to be busy", func() bool { return active.Load() >= maxConns })
		unblock()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("Charge: %v", err)
		}
		if n := conns.Load(); n > maxConns {
			t.Errorf("opened %d connections, MaxConns is %d", n, maxConns)
		}
		if p := peak.Load(); p != maxConns {
			t.Errorf("peak concurrency %d, want %d", p, maxConns)
		}
	})
}
