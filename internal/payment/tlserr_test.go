package payment

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// tlsServer is an https provider answering 200; hits counts the requests
// that reached the handler.
func tlsServer(t *testing.T, maxVersion uint16) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, `{"charge_id":"ch_tls"}`)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // rejected handshakes log
	srv.TLS = &tls.Config{MaxVersion: maxVersion}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &hits
}

// Every way our side refuses the provider's TLS is Systemic (pause, never
// dead-letter), says the charge was not sent, and reaches no handler.
func TestTLSRejectedIsSystemic(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		srv, hits := tlsServer(t, 0)
		trusted := x509.NewCertPool()
		trusted.AddCert(srv.Certificate())

		tests := []struct {
			name string
			url  string
			tls  *tls.Config
		}{
			{"system roots", srv.URL, nil},
			{"another CA", srv.URL, &tls.Config{RootCAs: x509.NewCertPool()}},
			{"wrong name", srv.URL, &tls.Config{RootCAs: trusted, ServerName: "pay.invalid"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := newClient(t, tt.url, func(cfg *Config) { cfg.TLS = tt.tls })
				_, err := c.Charge(t.Context(), testCharge())
				e := mustPaymentError(t, err)
				if e.Kind != fault.Systemic || e.Status != 0 || fault.KindOf(err) != fault.Systemic {
					t.Errorf("error %+v (%v), want Systemic without status", e, err)
				}
				if !strings.Contains(err.Error(), "not sent") {
					t.Errorf("error %q does not say the charge was not sent", err)
				}
			})
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("%d requests reached a server the client must not trust", n)
		}
	})
}

// A provider that offers only TLS 1.1 is refused: the client's floor is
// TLS 1.2 whatever Config.TLS says.
func TestTLSBelow12Refused(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		srv, hits := tlsServer(t, tls.VersionTLS11)
		trusted := x509.NewCertPool()
		trusted.AddCert(srv.Certificate())
		c := newClient(t, srv.URL, func(cfg *Config) { cfg.TLS = &tls.Config{RootCAs: trusted} })
		if _, err := c.Charge(t.Context(), testCharge()); err == nil {
			t.Fatal("charged over TLS 1.1")
		}
		if hits.Load() != 0 {
			t.Error("a request reached a TLS 1.1 server")
		}
	})
}
