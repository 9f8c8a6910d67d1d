package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain hides the BILLING_TEST_* variables that locate the test
// servers from the unknown-variable check: they belong to the test suite,
// and run is called in this process.
func TestMain(m *testing.M) {
	environ = func() []string {
		var out []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, envPrefix+"_TEST_") {
				out = append(out, kv)
			}
		}
		return out
	}
	os.Exit(m.Run())
}

// A misspelt variable stops the start, named with the nearest known one,
// instead of leaving a default in force (BILLING_CONCURENCY=1 ran on 1024).
func TestUnknownVariablesRejected(t *testing.T) {
	for _, tt := range []struct{ set, want string }{
		{"BILLING_CONCURENCY", "BILLING_CONCURRENCY"},
		{"BILLING_KAFKA_BROKER", "BILLING_KAFKA_BROKERS"},
		{"BILLING_PAYMENT_TOKEN_FLIE", "BILLING_PAYMENT_TOKEN_FILE"},
		{"BILLING_DLQ_MAX_REPLAY", "BILLING_DLQ_MAX_REPLAYS"},
	} {
		t.Run(tt.set, func(t *testing.T) {
			setEnv(t, validEnv, map[string]string{tt.set: "s3cr3t-value"})
			_, err := loadAndValidate()
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			checkConfigError(t, msg, tt.set)
			if !strings.Contains(msg, "did you mean "+tt.want+"?") {
				t.Errorf("error %q does not suggest %s", msg, tt.want)
			}
			if strings.Contains(msg, "s3cr3t") {
				t.Errorf("error %q shows the value", msg)
			}
		})
	}
}

// The variables Kubernetes injects for a Service named billing-consumer
// (service links) are not ours and must not crash-loop the pod; a near
// miss of the family is still unknown.
func TestServiceLinkVariablesAccepted(t *testing.T) {
	links := map[string]string{
		"BILLING_CONSUMER_SERVICE_HOST":          "10.0.0.7",
		"BILLING_CONSUMER_SERVICE_PORT":          "9090",
		"BILLING_CONSUMER_SERVICE_PORT_HTTP":     "9090",
		"BILLING_CONSUMER_PORT":                  "tcp://10.0.0.7:9090",
		"BILLING_CONSUMER_PORT_9090_TCP":         "tcp://10.0.0.7:9090",
		"BILLING_CONSUMER_PORT_9090_TCP_PROTO":   "tcp",
		"BILLING_CONSUMER_PORT_9090_TCP_PORT":    "9090",
		"BILLING_CONSUMER_PORT_9090_TCP_ADDR":    "10.0.0.7",
		"BILLING_CONSUMER_PORT_8125_UDP_ADDR":    "10.0.0.7",
		"BILLING_CONSUMER_SERVICE_PORT_METRICS2": "9091",
	}
	setEnv(t, validEnv, links)
	if _, err := loadAndValidate(); err != nil {
		t.Fatalf("service link variables rejected: %v", err)
	}
	for _, bad := range []string{"BILLING_CONSUMER_SERVICE_HOSTS", "BILLING_CONSUMER_PORT_9090", "BILLING_CONSUMER_PORT_X_TCP"} {
		setEnv(t, validEnv, links, map[string]string{bad: "1"})
		if _, err := loadAndValidate(); err == nil || !strings.HasPrefix(err.Error(), bad+": unknown variable") {
			t.Errorf("%s: %v, want unknown", bad, err)
		}
	}
}

// Every kind of problem in one start, each named once: an unknown
// variable, a value that does not parse (which used to hide the rest), a
// required one missing, a range, two TLS/SASL problems (which used to stop
// at the first), a secret given twice (which also said "required"), an
// unreadable secret file (its path) and a wrong connection-string
// parameter (sslmode, which was "not a valid connection string").
func TestEveryProblemAtOnce(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-password")
	setEnv(t, map[string]string{
		"BILLING_KAFKA_BROKER":             "k:9092",
		"BILLING_PAYMENT_TIMEOUT":          "10",
		"BILLING_DATABASE_URL":             "postgres://u:hunter2pw@db:5432/x?sslmode=bogus",
		"BILLING_MAX_ATTEMPTS":             "0",
		"BILLING_KAFKA_TLS_CA_FILE":        "/no-such-ca.pem",
		"BILLING_KAFKA_SASL_MECHANISM":     "scram-sha-512",
		"BILLING_KAFKA_SASL_PASSWORD_FILE": missing,
		"BILLING_PAYMENT_TOKEN":            "tok-s3cr3t",
		"BILLING_PAYMENT_TOKEN_FILE":       writeFile(t, "token", "tok-file-s3cr3t"),
	})
	_, err := loadAndValidate()
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "\r\n") {
		t.Errorf("not one line: %q", msg)
	}
	for _, want := range []string{
		"BILLING_KAFKA_BROKER: unknown variable; did you mean BILLING_KAFKA_BROKERS?",
		`BILLING_PAYMENT_TIMEOUT: cannot parse "10" as time.Duration`,
		"BILLING_KAFKA_BROKERS: required",
		"BILLING_PAYMENT_URL: required",
		"BILLING_MAX_ATTEMPTS: must be between 1 and 100",
		"BILLING_KAFKA_TLS_CA_FILE: set, but BILLING_KAFKA_TLS is false",
		"BILLING_KAFKA_TLS_CA_FILE: cannot read /no-such-ca.pem: no such file or directory",
		"BILLING_KAFKA_SASL_USERNAME: required with BILLING_KAFKA_SASL_MECHANISM=scram-sha-512",
		"BILLING_KAFKA_SASL_PASSWORD_FILE: cannot read " + missing,
		"BILLING_PAYMENT_TOKEN and BILLING_PAYMENT_TOKEN_FILE are both set; set one",
		"BILLING_DATABASE_URL: failed to configure TLS (sslmode is invalid)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	for _, never := range []string{"BILLING_PAYMENT_TOKEN: required", "BILLING_KAFKA_SASL_PASSWORD: required",
		"BILLING_PAYMENT_TIMEOUT: must", "hunter2pw", "s3cr3t"} {
		if strings.Contains(msg, never) {
			t.Errorf("error holds %q:\n%s", never, msg)
		}
	}
	if n := strings.Count(msg, "BILLING_PAYMENT_TIMEOUT:"); n != 1 {
		t.Errorf("BILLING_PAYMENT_TIMEOUT told %d times:\n%s", n, msg)
	}
}

// Each wrong connection-string parameter is named, and a password is never
// shown, in either syntax.
func TestDatabaseURLParameterNamed(t *testing.T) {
	for _, tt := range []struct{ url, want string }{
		{"postgres://u:pw-s3cr3t@db:5432/x?sslmode=verify-ful", "sslmode is invalid"},
		{"host=db user=u password=pw-s3cr3t sslmode=nope", "sslmode is invalid"},
		{"postgres://u:pw-s3cr3t@db:notaport/x", "BILLING_DATABASE_URL: "},
		{"postgres://u:pw-s3cr3t@db/x?connect_timeout=soon", "connect_timeout"},
		{"postgres://u:pw-s3cr3t@db/x?pool_max_conns=many", "pool_max_conns"},
	} {
		setEnv(t, validEnv, map[string]string{"BILLING_DATABASE_URL": tt.url})
		_, err := loadAndValidate()
		if err == nil {
			t.Errorf("%s accepted", tt.want)
			continue
		}
		checkConfigError(t, err.Error(), "BILLING_DATABASE_URL")
		if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("error %q: want %q and no password", err, tt.want)
		}
	}
}
