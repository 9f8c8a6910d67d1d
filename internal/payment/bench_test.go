package payment

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/metrics"
	"sync"
	"syscall"
	"testing"
	"time"
)

// cpuTime returns the user+system CPU time the process has used: a cost
// per op that other processes on a shared machine do not inflate as they
// do wall-clock ns/op. It includes the in-process provider's share.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// goroutinesCreated reads the runtime's count of goroutines created since
// the program started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// rawProvider serves every request on a connection with one canned 200
// answer, from one goroutine per connection and without net/http's server,
// so that the goroutines a benchmark counts are the client's own.
func rawProvider(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	b.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	const answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n" +
		`{"charge_id":"ch_1"}`
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				r := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(r)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(c, answer); err != nil {
						return
					}
				}
			})
		}
	})
	return "http://" + ln.Addr().String()
}

// BenchmarkCharge measures one successful attempt, sequentially and in
// parallel, against a provider on loopback: "raw" is a minimal HTTP/1.1
// responder (goroutines/op are then the client's alone), "httptest" a
// net/http server (its per-request goroutines are counted too). cpu-ns/op
// is the process's CPU time per op, client and provider together. Run it
// with -benchmem.
func BenchmarkCharge(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"charge_id":"ch_1"}`)
	}))
	b.Cleanup(srv.Close)
	tlsSrv := httptest.NewUnstartedServer(srv.Config.Handler)
	tlsSrv.EnableHTTP2 = true // offered as a real provider offers it: net/http takes it, fasthttp cannot
	tlsSrv.StartTLS()
	b.Cleanup(tlsSrv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(tlsSrv.Certificate())
	for _, p := range []struct {
		name string
		url  func(*testing.B) string
		tls  *tls.Config
	}{
		{"raw", rawProvider, nil},
		{"httptest", func(*testing.B) string { return srv.URL }, nil},
		{"httptest-tls", func(*testing.B) string { return tlsSrv.URL }, &tls.Config{RootCAs: roots}},
	} {
		for _, e := range engines {
			b.Run(p.name+"/"+string(e), func(b *testing.B) { benchmarkCharge(b, e, p.url(b), p.tls) })
		}
	}
}

// benchmarkCharge is BenchmarkCharge of one engine and provider.
func benchmarkCharge(b *testing.B, e Engine, url string, tlsCfg *tls.Config) {
	{
		{
			c, err := New(Config{Engine: e, BaseURL: url, Token: testToken, Timeout: 5 * time.Second, MaxConns: 4, TLS: tlsCfg})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.CloseIdleConnections)
			ch := testCharge()
			b.Run("serial", func(b *testing.B) {
				b.ReportAllocs()
				g0, cpu0 := goroutinesCreated(), cpuTime(b)
				for b.Loop() {
					if res, err := c.Charge(b.Context(), ch); err != nil || res.ChargeID != "ch_1" {
						b.Fatalf("Charge = %+v, %v", res, err)
					}
				}
				b.ReportMetric(float64(goroutinesCreated()-g0)/float64(b.N), "goroutines/op")
				b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			})
			b.Run("parallel", func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(1) // GOMAXPROCS callers, within MaxConns on this machine
				g0, cpu0 := goroutinesCreated(), cpuTime(b)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if res, err := c.Charge(b.Context(), ch); err != nil || res.ChargeID != "ch_1" {
							b.Errorf("Charge = %+v, %v", res, err)
							return
						}
					}
				})
				b.ReportMetric(float64(goroutinesCreated()-g0)/float64(b.N), "goroutines/op")
				b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
