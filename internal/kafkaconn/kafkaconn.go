// Package kafkaconn builds the connection settings shared by every Kafka
// client of billing-consumer from one security configuration: TLS (1.2 or
// later, optional private CA and client certificate) and SASL (PLAIN,
// SCRAM-SHA-256 or SCRAM-SHA-512).
//
// kafka-go connects in two ways: a *kafka.Dialer (consumer groups and
// partition readers) and a *kafka.Transport (writers and *kafka.Client
// admin requests). New returns both, configured alike, so no client can be
// left on plaintext or without credentials by accident.
package kafkaconn

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// Mechanism is a SASL mechanism, named in lower case as in
// BILLING_KAFKA_SASL_MECHANISM.
type Mechanism string

// The supported mechanisms.
const (
	None        Mechanism = "none"
	Plain       Mechanism = "plain"
	ScramSHA256 Mechanism = "scram-sha-256"
	ScramSHA512 Mechanism = "scram-sha-512"
)

// ParseMechanism reads a mechanism name, case-insensitively ("SCRAM-SHA-512"
// is Kafka's spelling); "" means None.
func ParseMechanism(s string) (Mechanism, error) {
	m := Mechanism(strings.ToLower(strings.TrimSpace(s)))
	switch m {
	case "":
		return None, nil
	case None, Plain, ScramSHA256, ScramSHA512:
		return m, nil
	}
	return "", fmt.Errorf("unknown SASL mechanism %q (want none, plain, scram-sha-256 or scram-sha-512)", s)
}

// Config is how to secure the connections to the brokers. The zero value is
// plaintext without authentication.
type Config struct {
	// TLS encrypts every connection and verifies the brokers' certificates
	// (never skipped). The other TLS fields require it.
	TLS bool
	// CAFile is a PEM file of the CA certificates trusted to sign the
	// brokers' certificates; empty means the system roots.
	CAFile string
	// CertFile and KeyFile are the PEM client certificate (chain) and its
	// unencrypted private key, for brokers that authenticate clients by
	// certificate (ssl.client.auth=required). Both or neither.
	CertFile, KeyFile string
	// ServerName is the name verified in every broker's certificate; empty
	// means the host part of the address dialled.
	ServerName string

	// Mechanism is the SASL mechanism; "" means None. Plain sends the
	// password as is, so it requires TLS.
	Mechanism Mechanism
	// Username and Password are the SASL credentials, required with a
	// mechanism and refused without one. The password never appears in an
	// error of this package.
	Username, Password string
	// PasswordFile, when set, is the file Password was read from: it is
	// read again for every new connection, so a rotated password is used
	// without a restart (see fileMechanism). Logger, when set, says when
	// it changed or could not be read.
	PasswordFile string
	Logger       *slog.Logger

	// DialTimeout bounds connecting, the TLS handshake and SASL
	// authentication of one connection; zero means 10s.
	DialTimeout time.Duration
}

// Error is a configuration error about one field of Config (named as in the
// struct: "CAFile", "Mechanism", ...), so that callers can name the setting
// the user has to fix. Its message never contains the password.
type Error struct {
	Field string
	Err   error
}

func (e *Error) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func fieldErr(field, format string, args ...any) error {
	return &Error{Field: field, Err: fmt.Errorf(format, args...)}
}

// Validate checks the combination of settings without touching files.
// Errors are *Error.
func (c Config) Validate() error {
	m, err := ParseMechanism(string(c.Mechanism))
	if err != nil {
		return &Error{Field: "Mechanism", Err: err}
	}
	if !c.TLS {
		for _, f := range []struct{ name, value string }{
			{"CAFile", c.CAFile}, {"CertFile", c.CertFile}, {"KeyFile", c.KeyFile}, {"ServerName", c.ServerName},
		} {
			if f.value != "" {
				return fieldErr(f.name, "set, but TLS is off")
			}
		}
	}
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		return fieldErr("KeyFile", "required with a client certificate")
	case c.KeyFile != "" && c.CertFile == "":
		return fieldErr("CertFile", "required with a client key")
	}
	if m == None {
		if c.Username != "" || c.Password != "" {
			return fieldErr("Mechanism", "none, but SASL credentials are set")
		}
		return nil
	}
	switch {
	case c.Username == "":
		return fieldErr("Username", "required with SASL %s", m)
	case c.Password == "":
		return fieldErr("Password", "required with SASL %s", m)
	case m == Plain && !c.TLS:
		return fieldErr("Mechanism", "plain sends the password unencrypted; it requires TLS")
	}
	return nil
}

// Conns are the connection settings of every kafka-go client. Both values
// are safe for concurrent use. The Transport holds a connection pool: share
// it between the writers and clients of one process.
type Conns struct {
	// Dialer is for kafka.ConsumerGroupConfig and kafka.ReaderConfig.
	Dialer *kafka.Dialer
	// Transport is for kafka.Writer and kafka.Client.
	Transport *kafka.Transport

	cfg Config
}

// New validates cfg, reads its certificate files and returns the Dialer and
// Transport that use them. Errors are *Error.
func New(cfg Config) (*Conns, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Mechanism, _ = ParseMechanism(string(cfg.Mechanism)) // validated
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	var tlsCfg *tls.Config
	if cfg.TLS {
		var err error
		if tlsCfg, err = cfg.tlsConfig(); err != nil {
			return nil, err
		}
	}
	mech, err := cfg.mechanism()
	if err != nil {
		return nil, err
	}
	if mech != nil && cfg.PasswordFile != "" {
		mech = newFileMechanism(cfg, mech)
	}
	return &Conns{
		Dialer: &kafka.Dialer{
			// kafka.DefaultDialer's settings, plus security.
			Timeout:       cfg.DialTimeout,
			DualStack:     true,
			TLS:           tlsCfg,
			SASLMechanism: mech,
		},
		Transport: &kafka.Transport{
			DialTimeout: cfg.DialTimeout,
			TLS:         tlsCfg,
			SASL:        mech,
		},
		cfg: cfg,
	}, nil
}

// tlsConfig is the client TLS configuration: TLS 1.2 or later, the CA file's
// roots (or the system's), the client certificate if any.
func (c Config) tlsConfig() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		b, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, &Error{Field: "CAFile", Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fieldErr("CAFile", "%s holds no PEM certificate", c.CAFile)
		}
		t.RootCAs = pool
	}
	if c.CertFile != "" {
		certPEM, err := os.ReadFile(c.CertFile)
		if err != nil {
			return nil, &Error{Field: "CertFile", Err: err}
		}
		if !hasBlock(certPEM, "CERTIFICATE") {
			return nil, fieldErr("CertFile", "%s holds no PEM certificate", c.CertFile)
		}
		keyPEM, err := os.ReadFile(c.KeyFile)
		if err != nil {
			return nil, &Error{Field: "KeyFile", Err: err}
		}
		// X509KeyPair's errors describe, never quote, the key.
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fieldErr("KeyFile", "%s with %s: %v", c.KeyFile, c.CertFile, err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// hasBlock reports whether b holds a PEM block of the given type.
func hasBlock(b []byte, typ string) bool {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return false
		}
		if blk.Type == typ {
			return true
		}
	}
}

// mechanism returns kafka-go's SASL mechanism, nil for None.
func (c Config) mechanism() (sasl.Mechanism, error) {
	var algo scram.Algorithm
	switch c.Mechanism {
	case None:
		return nil, nil
	case Plain:
		return plain.Mechanism{Username: c.Username, Password: c.Password}, nil
	case ScramSHA256:
		algo = scram.SHA256
	case ScramSHA512:
		algo = scram.SHA512
	default:
		return nil, fieldErr("Mechanism", "unknown SASL mechanism %q", c.Mechanism)
	}
	m, err := scram.Mechanism(algo, c.Username, c.Password)
	if err != nil {
		// SASLprep refused the user name or the password (a control or
		// prohibited character). xdg-go/scram's message quotes the
		// offending value, so it is dropped; trying the user name alone
		// tells which one it was.
		field := "Password"
		if _, uerr := scram.Mechanism(algo, c.Username, "x"); uerr != nil {
			field = "Username"
		}
		return nil, fieldErr(field, "has characters SCRAM does not allow (SASLprep: control or prohibited characters)")
	}
	return m, nil
}
