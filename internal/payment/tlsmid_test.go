package payment

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// A TLS record that breaks after the handshake (a corrupted or injected
// record header in the provider's answer) comes after the request was
// sent: the outcome is unknown, and the error must not say the money was
// not taken, or the claim would be released.
func TestTLSRecordBrokenAfterTheRequestIsNotNotTaken(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
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
	})
}

// net/http's silent replay of a charge can meet a certificate that fails
// verification on its new connection (a load balancer's node with a
// stale certificate): "not sent" describes the replay only. The first
// copy was written on a connection that died without an answer, so the
// outcome is unknown and NotTaken must be false.
func TestCertificateRejectedOnAReplayIsNotNotTaken(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		certSrv := httptest.NewTLSServer(http.NotFoundHandler()) // only for its certificate
		t.Cleanup(certSrv.Close)
		stale := selfSigned(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		var conns, reqs atomic.Int32
		go func() {
			for {
				raw, err := ln.Accept()
				if err != nil {
					return
				}
				cert := certSrv.TLS.Certificates
				if conns.Add(1) > 1 {
					cert = []tls.Certificate{stale}
				}
				go func() {
					defer raw.Close()
					conn := tls.Server(raw, &tls.Config{Certificates: cert})
					if conn.Handshake() != nil {
						return
					}
					br := bufio.NewReader(conn)
					for {
						req, err := http.ReadRequest(br)
						if err != nil {
							return
						}
						_, _ = io.Copy(io.Discard, req.Body)
						if reqs.Add(1) == 2 {
							return // the provider took it; the connection dies before the answer
						}
						_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"charge_id\":\"ch_1\"}"))
					}
				}()
			}
		}()
		trusted := x509.NewCertPool()
		trusted.AddCert(certSrv.Certificate())
		c := newClient(t, "https://"+ln.Addr().String(), func(cfg *Config) {
			cfg.TLS = &tls.Config{RootCAs: trusted, ServerName: "example.com"}
		})
		if _, err := c.Charge(t.Context(), testCharge()); err != nil {
			t.Fatalf("warm-up charge: %v", err)
		}
		second := testCharge()
		second.IdempotencyKey = "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1e"
		_, err = c.Charge(t.Context(), second)
		e := mustPaymentError(t, err)
		// fasthttp never replays: its one connection is the one that died.
		replayed := conns.Load() >= 2
		if replayed != (engineOf(t) == NetHTTP) || reqs.Load() != 2 {
			t.Fatalf("%d connections, %d requests read: want 2 requests, and the replay's handshake on a second connection for net/http only (%v)", conns.Load(), reqs.Load(), err)
		}
		t.Logf("the replay's error: %v", err)
		if e.NotTaken() {
			t.Errorf("a certificate rejected on the replay's connection says NotTaken (%v); want an unknown outcome", err)
		}
	})
}

// selfSigned returns a certificate for example.com that no test trusts.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "example.com"},
		DNSNames: []string{"example.com"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
