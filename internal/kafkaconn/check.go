package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	"github.com/segmentio/kafka-go"
)

// CheckKind says why Check could not connect.
type CheckKind int

const (
	// Unreachable: no broker answered (refused, timeout, reset). Clients
	// retry on their own; it may be a broker restart.
	Unreachable CheckKind = iota
	// TLSFailed: the TLS handshake failed, typically the broker's
	// certificate does not verify against the configured roots or name, the
	// broker refused our client certificate, or the listener does not speak
	// TLS. Retrying does not help: a configuration problem.
	TLSFailed
	// AuthFailed: the broker rejected the SASL credentials or mechanism.
	// Retrying does not help: a configuration problem.
	AuthFailed
)

// String names the kind for error messages.
func (k CheckKind) String() string {
	switch k {
	case TLSFailed:
		return "TLS handshake failed"
	case AuthFailed:
		return "SASL authentication failed"
	}
	return "connection failed"
}

// CheckError is the failure of Check. Its message names the broker, the
// mechanism and the user, never the password.
type CheckError struct {
	Kind   CheckKind
	Broker string
	Err    error
}

func (e *CheckError) Error() string {
	return fmt.Sprintf("kafka %s: %s: %v", e.Broker, e.Kind, e.Err)
}

// Unwrap returns the cause, kafka-go's or crypto/tls's error.
func (e *CheckError) Unwrap() error { return e.Err }

// Check opens one connection with the Dialer (TLS handshake and SASL
// authentication included) to the first of brokers that accepts one, and
// closes it. It returns nil on success, else a *CheckError: of kind
// TLSFailed or AuthFailed as soon as a broker fails so (a configuration
// problem, the same on every broker), of kind Unreachable when no broker
// could be reached. ctx bounds the whole check.
func (c *Conns) Check(ctx context.Context, brokers []string) error {
	var last error
	for _, b := range brokers {
		err := c.try(ctx, b)
		if err == nil {
			return nil
		}
		kind := classify(err)
		ce := &CheckError{Kind: kind, Broker: b, Err: err}
		if kind == AuthFailed {
			ce.Err = fmt.Errorf("mechanism %s, user %q: %w", c.mechanismName(), c.cfg.Username, err)
		}
		if kind != Unreachable {
			return ce
		}
		last = ce
		if ctx.Err() != nil {
			break
		}
	}
	return last
}

// try connects to broker and asks it for the cluster's brokers: a broker
// that requires SASL from a client without it accepts the connection and
// only fails the first request.
func (c *Conns) try(ctx context.Context, broker string) error {
	conn, err := c.Dialer.DialContext(ctx, "tcp", broker)
	if err != nil {
		return err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	_, err = conn.Brokers()
	return err
}

func (c *Conns) mechanismName() string {
	if m := c.Dialer.SASLMechanism; m != nil {
		return m.Name()
	}
	return string(None)
}

// classify tells configuration failures, which retrying cannot fix, from
// the rest.
func classify(err error) CheckKind {
	var (
		verify    *tls.CertificateVerificationError
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		op        *net.OpError
	)
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed), errors.Is(err, kafka.UnsupportedSASLMechanism),
		errors.Is(err, kafka.IllegalSASLState):
		return AuthFailed
	case errors.As(err, &verify), errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &record):
		return TLSFailed
	case errors.As(err, &op) && op.Op == "remote error":
		// crypto/tls reports an alert from the peer so: the broker
		// refused the handshake (a missing or untrusted client
		// certificate, no common version or cipher).
		return TLSFailed
	}
	return Unreachable
}
