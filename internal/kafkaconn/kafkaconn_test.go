package kafkaconn

import (
	"crypto/tls"
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

const testPassword = "pw-Zq8sEcReT"

func TestParseMechanism(t *testing.T) {
	for in, want := range map[string]Mechanism{
		"": None, "none": None, "plain": Plain, "PLAIN": Plain, " scram-sha-256 ": ScramSHA256,
		"SCRAM-SHA-512": ScramSHA512,
	} {
		got, err := ParseMechanism(in)
		if err != nil || got != want {
			t.Errorf("ParseMechanism(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"scram", "gssapi", "oauthbearer", "scram-sha-1", "plain,scram-sha-256"} {
		if _, err := ParseMechanism(in); err == nil {
			t.Errorf("ParseMechanism(%q) accepted", in)
		}
	}
}

// Every wrong combination names the field to fix, and no message carries
// the password.
func TestValidateErrors(t *testing.T) {
	p := newPKI(t, "validate-ca")
	sasl := func(m Mechanism) Config {
		return Config{TLS: true, Mechanism: m, Username: "billing", Password: testPassword}
	}
	tests := []struct {
		name      string
		cfg       Config
		wantField string
	}{
		{"unknown mechanism", Config{Mechanism: "gssapi"}, "Mechanism"},
		{"CA without TLS", Config{CAFile: p.caFile}, "CAFile"},
		{"client cert without TLS", Config{CertFile: p.clientCertFile, KeyFile: p.clientKeyFile}, "CertFile"},
		{"server name without TLS", Config{ServerName: "kafka"}, "ServerName"},
		{"cert without key", Config{TLS: true, CertFile: p.clientCertFile}, "KeyFile"},
		{"key without cert", Config{TLS: true, KeyFile: p.clientKeyFile}, "CertFile"},
		{"credentials without mechanism", Config{Username: "billing", Password: testPassword}, "Mechanism"},
		{"password without mechanism", Config{Password: testPassword}, "Mechanism"},
		{"mechanism without user", Config{Mechanism: ScramSHA256, Password: testPassword}, "Username"},
		{"mechanism without password", Config{Mechanism: ScramSHA512, Username: "billing"}, "Password"},
		{"plain without TLS", Config{Mechanism: Plain, Username: "billing", Password: testPassword}, "Mechanism"},
		{"unreadable CA", func() Config { c := sasl(Plain); c.CAFile = filepath.Join(t.TempDir(), "none.pem"); return c }(), "CAFile"},
		{"CA not PEM", func() Config { c := sasl(Plain); c.CAFile = writeFile(t, "ca.pem", "not a certificate"); return c }(), "CAFile"},
		{"CA is a key", func() Config { c := sasl(Plain); c.CAFile = p.clientKeyFile; return c }(), "CAFile"},
		{"unreadable client cert", func() Config {
			c := sasl(Plain)
			c.CertFile, c.KeyFile = filepath.Join(t.TempDir(), "none.pem"), p.clientKeyFile
			return c
		}(), "CertFile"},
		{"client cert is a key", func() Config {
			c := sasl(Plain)
			c.CertFile, c.KeyFile = p.clientKeyFile, p.clientKeyFile
			return c
		}(), "CertFile"},
		{"unreadable key", func() Config {
			c := sasl(Plain)
			c.CertFile, c.KeyFile = p.clientCertFile, filepath.Join(t.TempDir(), "none.key")
			return c
		}(), "KeyFile"},
		{"key of another certificate", func() Config {
			c := sasl(Plain)
			c.CertFile, c.KeyFile = p.clientCertFile, p.serverKeyFile
			return c
		}(), "KeyFile"},
		{"SCRAM password SASLprep refuses", func() Config {
			c := sasl(ScramSHA256)
			c.Password = testPassword + "\u0007"
			return c
		}(), "Password"},
		{"SCRAM user name SASLprep refuses", func() Config {
			c := sasl(ScramSHA512)
			c.Username = "bill\u0000ing"
			return c
		}(), "Username"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("New = %v, want an *Error", err)
			}
			if ce.Field != tt.wantField {
				t.Errorf("field %q, want %q (%v)", ce.Field, tt.wantField, err)
			}
			if strings.Contains(err.Error(), testPassword) {
				t.Errorf("error reveals the password: %v", err)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestPlaintextByDefault(t *testing.T) {
	c, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Dialer.TLS != nil || c.Dialer.SASLMechanism != nil || c.Transport.TLS != nil || c.Transport.SASL != nil {
		t.Errorf("zero Config is not plaintext without SASL: %+v %+v", c.Dialer, c.Transport)
	}
	if c.Dialer.Timeout <= 0 || c.Transport.DialTimeout <= 0 {
		t.Errorf("no dial timeout: %v %v", c.Dialer.Timeout, c.Transport.DialTimeout)
	}
}

// The Dialer and the Transport get the same TLS settings and mechanism:
// TLS 1.2 at least, the CA file's roots only, the client certificate.
func TestDialerAndTransportAlike(t *testing.T) {
	p := newPKI(t, "alike-ca")
	for m, name := range map[Mechanism]string{Plain: "PLAIN", ScramSHA256: "SCRAM-SHA-256", ScramSHA512: "SCRAM-SHA-512"} {
		c, err := New(Config{
			TLS: true, CAFile: p.caFile, CertFile: p.clientCertFile, KeyFile: p.clientKeyFile, ServerName: "kafka.internal",
			Mechanism: m, Username: "billing", Password: testPassword,
		})
		if err != nil {
			t.Fatal(err)
		}
		dt, tt := c.Dialer.TLS, c.Transport.TLS
		if dt == nil || dt != tt {
			t.Fatalf("%s: Dialer and Transport TLS differ: %p %p", m, dt, tt)
		}
		if dt.MinVersion != tls.VersionTLS12 || dt.InsecureSkipVerify || dt.ServerName != "kafka.internal" ||
			dt.RootCAs == nil || !dt.RootCAs.Equal(p.caPool) || len(dt.Certificates) != 1 {
			t.Errorf("%s: TLS config %+v", m, dt)
		}
		if c.Dialer.SASLMechanism == nil || c.Dialer.SASLMechanism != c.Transport.SASL || c.Dialer.SASLMechanism.Name() != name {
			t.Errorf("%s: mechanisms %v / %v, want %s on both", m, c.Dialer.SASLMechanism, c.Transport.SASL, name)
		}
	}
}

func TestSystemRootsWithoutCAFile(t *testing.T) {
	c, err := New(Config{TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.Dialer.TLS.RootCAs != nil || c.Dialer.TLS.MinVersion != tls.VersionTLS12 {
		t.Errorf("TLS config %+v, want system roots and TLS 1.2", c.Dialer.TLS)
	}
}

// A CA file that cannot be read is a clear error naming CAFile, not a
// silent fallback to system roots. Permissions cannot make a file
// unreadable to root, which CI runs as, so the files here fail to read for
// anyone: a directory (open succeeds, read fails with EISDIR) and
// /proc/self/mem (read at offset 0 fails with EIO).
func TestUnreadableCAFile(t *testing.T) {
	for name, path := range map[string]string{
		"a directory":    t.TempDir(),
		"/proc/self/mem": "/proc/self/mem",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(Config{TLS: true, CAFile: path})
			var ce *Error
			var pe *fs.PathError
			if !errors.As(err, &ce) || ce.Field != "CAFile" || !errors.As(err, &pe) {
				t.Fatalf("New = %v, want the CAFile error of reading %s", err, path)
			}
		})
	}
}
