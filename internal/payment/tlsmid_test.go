package payment

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// A TLS record that breaks after the handshake (a corrupted or injected
// record header in the provider's answer) comes after the request was
// sent: the outcome is unknown, and the error must not say the money was
// not taken, or the claim would be released.
func TestTLSRecordBrokenAfterTheRequestIsNotNotTaken(t *testing.T) {
	certSrv := httptest.NewTLSServer(http.NotFoundHandler()) // only for its certificate
	t.Cleanup(certSrv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var hits atomic.Int32
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer raw.Close()
				conn := tls.Server(raw, &tls.Config{Certificates: certSrv.TLS.Certificates})
				if conn.Handshake() != nil {
					return
				}
				if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
					return
				}
				hits.Add(1)                                            // the provider took the charge
				_, _ = raw.Write([]byte{0x17, 0x03, 0x03, 0xff, 0xff}) // an oversized record
			}()
		}
	}()
	trusted := x509.NewCertPool()
	trusted.AddCert(certSrv.Certificate())
	c := newClient(t, "https://"+ln.Addr().String(), func(cfg *Config) {
		cfg.TLS = &tls.Config{RootCAs: trusted, ServerName: "example.com"}
	})
	_, err = c.Charge(t.Context(), testCharge())
	e := mustPaymentError(t, err)
	if hits.Load() == 0 {
		t.Fatalf("the request never reached the server: %v", err)
	}
	if e.NotTaken() {
		t.Errorf("error %+v (%v) after the request was sent says NotTaken; want an unknown outcome", e, err)
	}
}
