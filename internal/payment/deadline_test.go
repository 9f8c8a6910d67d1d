package payment

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// TestAttemptDeadlineWithoutResponseHeaderTimeout checks the one deadline
// that is left (the Transport has no ResponseHeaderTimeout): a provider
// that never sends its headers, or sends a 2xx's headers and then stalls
// the body, over HTTP/1.1 and HTTP/2, is cut off by the attempt's timeout
// alone, and that is an unknown outcome: Transient, no status, not proof
// that the money was not taken, and not the caller's cancellation. The
// provider never answers in full, so only a deadline can end Charge.
func TestAttemptDeadlineWithoutResponseHeaderTimeout(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for _, h2 := range []bool{false, true} {
			for _, stall := range []string{"headers", "body"} {
				name := map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2] + " " + stall
				t.Run(name, func(t *testing.T) {
					done := make(chan struct{})
					srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						_, _ = io.ReadAll(r.Body)
						if stall == "body" {
							w.Header().Set("Content-Length", "100")
							w.WriteHeader(http.StatusOK)
							_, _ = io.WriteString(w, `{"charge_id":"ch_`)
							w.(http.Flusher).Flush()
						}
						select {
						case <-r.Context().Done():
						case <-done:
						}
					}))
					srv.Config.ErrorLog = log.New(io.Discard, "", 0)
					srv.EnableHTTP2 = h2
					srv.StartTLS()
					t.Cleanup(srv.Close)
					t.Cleanup(func() { close(done) }) // runs before srv.Close
					roots := x509.NewCertPool()
					roots.AddCert(srv.Certificate())
					c := newClient(t, srv.URL, func(cfg *Config) {
						cfg.TLS = &tls.Config{RootCAs: roots}
						cfg.Timeout = 300 * time.Millisecond
					})
					// The caller's own deadline only keeps a broken attempt
					// deadline from hanging the test; it must not be what fires.
					ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
					defer cancel()
					_, err := c.Charge(ctx, testCharge())
					e := mustPaymentError(t, err)
					if e.Kind != fault.Transient || e.Status != 0 || e.NotTaken() {
						t.Errorf("%v: %+v, NotTaken %v; want Transient without status, not NotTaken", err, e, e.NotTaken())
					}
					if errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "no answer within 300ms") {
						t.Errorf("%v: want the attempt's own timeout", err)
					}
				})
			}
		}
	})
}
