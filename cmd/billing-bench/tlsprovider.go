package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// tlsProvider is what a mode with tls needs to reach the simulator over
// TLS as the consumer reaches the provider in production: a test CA,
// given to the consumer as BILLING_PAYMENT_CA_FILE, and the simulator's
// certificate for 127.0.0.1 signed by it. One is made per bench run.
type tlsProvider struct {
	caFile string
	cert   tls.Certificate
}

// providerTLS returns the run's tlsProvider, making it on first use; the
// CA file goes next to the -log file.
func (b *bench) providerTLS() (*tlsProvider, error) {
	if b.tlsProv != nil {
		return b.tlsProv, nil
	}
	p, err := newTLSProvider(filepath.Join(filepath.Dir(b.o.logPath), "billing-bench-provider-ca.pem"))
	if err != nil {
		return nil, fmt.Errorf("provider TLS: %w", err)
	}
	b.tlsProv = p
	return p, nil
}

func newTLSProvider(caFile string) (*tlsProvider, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "billing-bench test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return nil, err
	}
	return &tlsProvider{caFile: caFile, cert: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}}, nil
}

// serverConfig is the simulator's TLS configuration: TLS 1.2 at least,
// HTTP/2 and HTTP/1.1 offered (http.Server.ServeTLS adds h2).
func (p *tlsProvider) serverConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.cert}, MinVersion: tls.VersionTLS12}
}
