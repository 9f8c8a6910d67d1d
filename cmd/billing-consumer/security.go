package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/kafkaconn"
)

// kafkaSecurity is the kafkaconn configuration of the BILLING_KAFKA_TLS*
// and BILLING_KAFKA_SASL_* variables.
func (c config) kafkaSecurity() kafkaconn.Config {
	return kafkaconn.Config{
		TLS:        c.KafkaTLS,
		CAFile:     c.KafkaTLSCaFile,
		CertFile:   c.KafkaTLSCertFile,
		KeyFile:    c.KafkaTLSKeyFile,
		ServerName: c.KafkaTLSServerName,
		Mechanism:  kafkaconn.Mechanism(c.KafkaSASLMechanism),
		Username:   c.KafkaSASLUsername,
		Password:   c.KafkaSASLPassword,
		// Re-read for each new connection: a rotated password is used
		// without a restart.
		PasswordFile: c.KafkaSASLPasswordFile,
	}
}

// kafkaVars names the variable of each kafkaconn.Config field.
var kafkaVars = map[string]string{
	"TLS":        "KAFKA_TLS",
	"CAFile":     "KAFKA_TLS_CA_FILE",
	"CertFile":   "KAFKA_TLS_CERT_FILE",
	"KeyFile":    "KAFKA_TLS_KEY_FILE",
	"ServerName": "KAFKA_TLS_SERVER_NAME",
	"Mechanism":  "KAFKA_SASL_MECHANISM",
	"Username":   "KAFKA_SASL_USERNAME",
	"Password":   "KAFKA_SASL_PASSWORD",
}

// validateKafkaSecurity checks the combination of the Kafka TLS and SASL
// variables and reports every problem, each naming the variable to fix.
// The files are read later, by kafkaConns.
func (c config) validateKafkaSecurity(v problem) {
	m, err := kafkaconn.ParseMechanism(c.KafkaSASLMechanism)
	if err != nil {
		v("KAFKA_SASL_MECHANISM", "%v", err)
	}
	if !c.KafkaTLS {
		for _, f := range []struct{ name, value string }{
			{"KAFKA_TLS_CA_FILE", c.KafkaTLSCaFile}, {"KAFKA_TLS_CERT_FILE", c.KafkaTLSCertFile},
			{"KAFKA_TLS_KEY_FILE", c.KafkaTLSKeyFile}, {"KAFKA_TLS_SERVER_NAME", c.KafkaTLSServerName},
		} {
			if f.value != "" {
				v(f.name, "set, but BILLING_KAFKA_TLS is false; set BILLING_KAFKA_TLS=true")
			}
		}
	}
	switch {
	case c.KafkaTLSCertFile != "" && c.KafkaTLSKeyFile == "":
		v("KAFKA_TLS_KEY_FILE", "required with BILLING_KAFKA_TLS_CERT_FILE")
	case c.KafkaTLSKeyFile != "" && c.KafkaTLSCertFile == "":
		v("KAFKA_TLS_CERT_FILE", "required with BILLING_KAFKA_TLS_KEY_FILE")
	}
	readable(v, "KAFKA_TLS_CA_FILE", c.KafkaTLSCaFile)
	readable(v, "KAFKA_TLS_CERT_FILE", c.KafkaTLSCertFile)
	readable(v, "KAFKA_TLS_KEY_FILE", c.KafkaTLSKeyFile)
	if err != nil {
		return // which SASL variables are needed depends on the mechanism
	}
	if m == kafkaconn.None {
		if c.KafkaSASLUsername != "" || c.KafkaSASLPassword != "" {
			v("KAFKA_SASL_MECHANISM", "none, but BILLING_KAFKA_SASL_USERNAME or _PASSWORD is set; set plain, scram-sha-256 or scram-sha-512")
		}
		return
	}
	if c.KafkaSASLUsername == "" {
		v("KAFKA_SASL_USERNAME", "required with BILLING_KAFKA_SASL_MECHANISM=%s", m)
	}
	if c.KafkaSASLPassword == "" {
		v("KAFKA_SASL_PASSWORD", "required with BILLING_KAFKA_SASL_MECHANISM=%s (or BILLING_KAFKA_SASL_PASSWORD_FILE)", m)
	}
	if m == kafkaconn.Plain && !c.KafkaTLS {
		v("KAFKA_SASL_MECHANISM", "plain sends the password unencrypted; it requires BILLING_KAFKA_TLS=true")
	}
}

// kafkaConns reads the Kafka certificate files and builds the Dialer and
// Transport every Kafka client of the process uses. Its errors name the
// variable and never contain the password. logger (nil: none) says when a
// BILLING_KAFKA_SASL_PASSWORD_FILE changed.
func kafkaConns(cfg config, logger *slog.Logger) (*kafkaconn.Conns, error) {
	sec := cfg.kafkaSecurity()
	sec.Logger = logger
	conns, err := kafkaconn.New(sec)
	var ce *kafkaconn.Error
	if errors.As(err, &ce) {
		return nil, fmt.Errorf("%s_%s: %w", envPrefix, kafkaVars[ce.Field], ce.Err)
	}
	return conns, err
}

// checkKafka connects once to the brokers, TLS and SASL included, before a
// one-shot command's clients start: a rejected password or certificate is
// a configuration error, reported as one line naming the variables to
// check, instead of a client that retries forever. A one-shot command does
// not wait for a broker it cannot reach either: it fails at once, and the
// operator runs it again.
func checkKafka(ctx context.Context, conns *kafkaconn.Conns, cfg config) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err := conns.Check(ctx, cfg.KafkaBrokers)
	var ce *kafkaconn.CheckError
	if !errors.As(err, &ce) {
		return err
	}
	if ce.Kind == kafkaconn.Unreachable {
		return fmt.Errorf("%w (check BILLING_KAFKA_BROKERS, and that the brokers are up)", err)
	}
	return kafkaCheckError(err, ce)
}

// kafkaCheckError adds to a refused connection the variables to check.
func kafkaCheckError(err error, ce *kafkaconn.CheckError) error {
	switch ce.Kind {
	case kafkaconn.AuthFailed:
		return fmt.Errorf("%w (check BILLING_KAFKA_SASL_MECHANISM, BILLING_KAFKA_SASL_USERNAME and BILLING_KAFKA_SASL_PASSWORD)", err)
	case kafkaconn.TLSFailed:
		return fmt.Errorf("%w (check BILLING_KAFKA_TLS, BILLING_KAFKA_TLS_CA_FILE, BILLING_KAFKA_TLS_SERVER_NAME and the client certificate)", err)
	}
	return err
}

// paymentTLS is the TLS configuration of the payment client: nil (the
// system roots) unless BILLING_PAYMENT_CA_FILE names the CAs to trust
// instead. payment.New enforces TLS 1.2 at least either way.
func paymentTLS(cfg config) (*tls.Config, error) {
	if cfg.PaymentCAFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(cfg.PaymentCAFile)
	if err != nil {
		return nil, fmt.Errorf("%s_PAYMENT_CA_FILE: %w", envPrefix, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s_PAYMENT_CA_FILE: %s holds no PEM certificate", envPrefix, cfg.PaymentCAFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
