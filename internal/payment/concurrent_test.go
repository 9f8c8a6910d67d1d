package payment

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/propagation"

	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// TestConcurrentChargesKeepTheirOwnRequestAndAnswer runs many charges at
// once, over HTTP/1.1 and HTTP/2, through one Client with a token and a
// propagator: every request must reach the provider with its own key,
// body and trace context and exactly one value per header (the header
// maps share the Content-Type, Accept and Authorization slices), and every
// answer must come back to its own caller, charge id or error code (they
// are read from pooled buffers).
func TestConcurrentChargesKeepTheirOwnRequestAndAnswer(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for _, h2 := range []bool{false, true} {
			t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
				var bad sync.Map
				// fasthttp speaks HTTP/1.1 only, also to a server offering HTTP/2.
				srv := httptest.NewUnstartedServer(concurrentProvider(h2 && engineOf(t) == NetHTTP, &bad))
				srv.Config.ErrorLog = log.New(io.Discard, "", 0)
				srv.EnableHTTP2 = h2
				srv.StartTLS()
				t.Cleanup(srv.Close)
				roots := x509.NewCertPool()
				roots.AddCert(srv.Certificate())
				c := newClient(t, srv.URL, func(cfg *Config) {
					cfg.TLS = &tls.Config{RootCAs: roots}
					cfg.Propagator = tracing.Propagator()
					cfg.MaxConns = 8
				})

				const calls = 400
				got := make([]string, calls+1) // by order: the charge id or error code
				var wg sync.WaitGroup
				for i := range calls {
					order := int64(1 + i)
					wg.Go(func() {
						ctx := tracing.Propagator().Extract(t.Context(),
							propagation.MapCarrier{"traceparent": concurrentTraceparent(order)})
						res, err := c.Charge(ctx, concurrentCharge(order))
						got[order] = res.ChargeID
						if order%2 == 0 {
							e := mustPaymentError(t, err)
							got[order] = strconv.Itoa(e.Status) + " " + e.Code
						}
					})
				}
				wg.Wait()
				// Checked only now, when the buffers the answers were read into
				// have been reused by many others.
				for order := int64(1); order <= calls; order++ {
					want := "ch_" + strconv.FormatInt(order, 10)
					if order%2 == 0 {
						want = "402 code_" + strconv.FormatInt(order, 10)
					}
					if got[order] != want {
						t.Errorf("order %d: answer %q, want %q", order, got[order], want)
					}
				}
				bad.Range(func(k, _ any) bool { t.Error(k); return true })
			})
		}
	})
}

// concurrentCharge is the charge of order n, with its own key and amount.
func concurrentCharge(n int64) Charge {
	return Charge{IdempotencyKey: fmt.Sprintf("0193a5c2-7f4e-7b1a-9c3d-%012x", n), OrderID: n, CustomerID: 42, Amount: money.Amount(100 + n)}
}

// concurrentTraceparent is the trace context of order n's record.
func concurrentTraceparent(n int64) string {
	return fmt.Sprintf("00-%032x-%016x-01", n, n)
}

// concurrentProvider checks each request against concurrentCharge of its
// order_id, noting every mismatch in bad, and answers odd orders 200 with
// charge id ch_<order> and even ones 402 with error code code_<order>.
func concurrentProvider(h2 bool, bad *sync.Map) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b struct {
			OrderID int64 `json:"order_id"`
		}
		_ = json.Unmarshal(body, &b)
		want := concurrentCharge(b.OrderID)
		for k, v := range map[string]string{
			"Idempotency-Key": want.IdempotencyKey, "Authorization": "Bearer " + testToken,
			"Content-Type": "application/json", "Accept": "application/json",
			"Traceparent": concurrentTraceparent(b.OrderID),
		} {
			if got := r.Header.Values(k); len(got) != 1 || got[0] != v {
				bad.Store(fmt.Sprintf("order %d: %s %q, want %q", b.OrderID, k, got, v), true)
			}
		}
		if string(body) != string(want.Body()) {
			bad.Store(fmt.Sprintf("order %d: body %q, want %q", b.OrderID, body, want.Body()), true)
		}
		if h2 != (r.ProtoMajor == 2) {
			bad.Store("protocol "+r.Proto, true)
		}
		// Padding makes the answers long enough to fill different
		// amounts of a pooled buffer.
		pad := make([]byte, b.OrderID%7*1000)
		for i := range pad {
			pad[i] = 'x'
		}
		if b.OrderID%2 == 0 {
			w.WriteHeader(http.StatusPaymentRequired)
			fmt.Fprintf(w, `{"pad":"%s","error":{"code":"code_%d"}}`, pad, b.OrderID)
			return
		}
		fmt.Fprintf(w, `{"pad":"%s","charge_id":"ch_%d"}`, pad, b.OrderID)
	})
}
