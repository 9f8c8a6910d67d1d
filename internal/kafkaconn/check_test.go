package kafkaconn

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// secureCluster is an in-process kfake broker that speaks TLS only and
// requires SASL, with one user per mechanism, each with its own password (so
// a client that picked the wrong algorithm cannot succeed).
func secureCluster(t *testing.T, p *pki, clientAuth tls.ClientAuthType) []string {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.caPool, ClientAuth: clientAuth, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "plain-user", "plain-"+testPassword),
		kfake.Superuser("SCRAM-SHA-256", "s256-user", "s256-"+testPassword),
		kfake.Superuser("SCRAM-SHA-512", "s512-user", "s512-"+testPassword),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

var users = map[Mechanism][2]string{
	Plain:       {"plain-user", "plain-" + testPassword},
	ScramSHA256: {"s256-user", "s256-" + testPassword},
	ScramSHA512: {"s512-user", "s512-" + testPassword},
}

func check(t *testing.T, cfg Config, brokers []string) (*Conns, error) {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c, c.Check(ctx, brokers)
}

// Each mechanism authenticates over TLS through both the Dialer (consumer
// groups, readers) and the Transport (writers, admin client).
func TestMechanismsOverTLS(t *testing.T) {
	p := newPKI(t, "mech-ca")
	brokers := secureCluster(t, p, tls.NoClientCert)
	for m, u := range users {
		t.Run(string(m), func(t *testing.T) {
			c, err := check(t, Config{TLS: true, CAFile: p.caFile, Mechanism: m, Username: u[0], Password: u[1]}, brokers)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: c.Transport}
			if _, err := client.Metadata(ctx, &kafka.MetadataRequest{}); err != nil {
				t.Fatalf("metadata through the Transport: %v", err)
			}
		})
	}
}

// A wrong password, a user of another mechanism, and no credentials at all
// are AuthFailed, and the password is not in the error.
func TestAuthFailures(t *testing.T) {
	p := newPKI(t, "auth-ca")
	brokers := secureCluster(t, p, tls.NoClientCert)
	tests := []struct {
		name string
		cfg  Config
	}{
		{"wrong password", Config{Mechanism: ScramSHA256, Username: "s256-user", Password: "wrong-" + testPassword}},
		{"SHA-512 user with SHA-256", Config{Mechanism: ScramSHA256, Username: "s512-user", Password: "s512-" + testPassword}},
		{"plain, wrong password", Config{Mechanism: Plain, Username: "plain-user", Password: "wrong-" + testPassword}},
		{"unknown user", Config{Mechanism: ScramSHA512, Username: "nobody", Password: "wrong-" + testPassword}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.TLS, tt.cfg.CAFile = true, p.caFile
			_, err := check(t, tt.cfg, brokers)
			var ce *CheckError
			if !errors.As(err, &ce) || ce.Kind != AuthFailed {
				t.Fatalf("Check = %v, want AuthFailed", err)
			}
			if strings.Contains(err.Error(), testPassword) {
				t.Errorf("error reveals the password: %v", err)
			}
			if !strings.Contains(err.Error(), tt.cfg.Username) || !strings.Contains(err.Error(), strings.ToUpper(string(tt.cfg.Mechanism))) {
				t.Errorf("error does not name the user and mechanism: %v", err)
			}
			t.Logf("%v", err)
		})
	}
}

// A client without SASL is not told it is connected: the broker accepts
// the connection and fails its first request.
func TestNoSASLAgainstSASLBroker(t *testing.T) {
	p := newPKI(t, "nosasl-ca")
	brokers := secureCluster(t, p, tls.NoClientCert)
	if _, err := check(t, Config{TLS: true, CAFile: p.caFile}, brokers); err == nil {
		t.Fatal("Check succeeded without SASL against a broker that requires it")
	} else {
		t.Logf("%v", err)
	}
}

func TestTLSFailures(t *testing.T) {
	p := newPKI(t, "tls-ca")
	other := newPKI(t, "other-ca")
	brokers := secureCluster(t, p, tls.NoClientCert)
	u := users[ScramSHA512]
	for name, cfg := range map[string]Config{
		"untrusted CA":          {TLS: true, CAFile: other.caFile},
		"system roots":          {TLS: true},
		"wrong server name":     {TLS: true, CAFile: p.caFile, ServerName: "kafka.example.com"},
		"CA of another cluster": {TLS: true, CAFile: other.caFile, ServerName: "localhost"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Mechanism, cfg.Username, cfg.Password = ScramSHA512, u[0], u[1]
			_, err := check(t, cfg, brokers)
			var ce *CheckError
			if !errors.As(err, &ce) || ce.Kind != TLSFailed {
				t.Fatalf("Check = %v, want TLSFailed", err)
			}
			t.Logf("%v", err)
		})
	}
}

// A broker that requires a client certificate accepts ours and refuses a
// client without one.
func TestClientCertificate(t *testing.T) {
	p := newPKI(t, "mtls-ca")
	brokers := secureCluster(t, p, tls.RequireAndVerifyClientCert)
	u := users[ScramSHA256]
	cfg := Config{TLS: true, CAFile: p.caFile, Mechanism: ScramSHA256, Username: u[0], Password: u[1]}
	if _, err := check(t, cfg, brokers); err == nil {
		t.Error("a broker requiring a client certificate accepted a client without one")
	} else {
		var ce *CheckError
		if !errors.As(err, &ce) || ce.Kind != TLSFailed {
			t.Errorf("without a client certificate: %v, want TLSFailed", err)
		}
	}
	cfg.CertFile, cfg.KeyFile = p.clientCertFile, p.clientKeyFile
	if _, err := check(t, cfg, brokers); err != nil {
		t.Errorf("with the client certificate: %v", err)
	}
}

// Nothing listening is Unreachable (retried by the clients), and the next
// broker of the list is tried.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	_, err = check(t, Config{}, []string{dead})
	var ce *CheckError
	if !errors.As(err, &ce) || ce.Kind != Unreachable || ce.Broker != dead {
		t.Fatalf("Check = %v, want Unreachable at %s", err, dead)
	}

	p := newPKI(t, "next-ca")
	brokers := secureCluster(t, p, tls.NoClientCert)
	u := users[Plain]
	if _, err := check(t, Config{TLS: true, CAFile: p.caFile, Mechanism: Plain, Username: u[0], Password: u[1]},
		append([]string{dead}, brokers...)); err != nil {
		t.Errorf("Check with a dead first broker: %v", err)
	}
}
