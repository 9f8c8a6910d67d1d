package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// loadAndValidate is what `run` does before touching the network.
func loadAndValidate() (config, error) { return configFor(need{kafka: true, payment: true}) }

func TestConfigDefaults(t *testing.T) {
	setEnv(t, validEnv)
	cfg, err := loadAndValidate()
	if err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	// SPEC §3.
	if cfg.KafkaTopic != "order-service.order.confirmed" || cfg.KafkaGroupID != "billing-order-confirmed" ||
		cfg.KafkaDLQTopic != "billing-order-confirmed.dlq" || cfg.HTTPAddr != ":9090" ||
		cfg.DedupRetention != 168*time.Hour {
		t.Errorf("SPEC defaults: %+v", cfg)
	}
	if len(cfg.KafkaBrokers) != 1 || cfg.KafkaBrokers[0] != "127.0.0.1:9092" {
		t.Errorf("brokers %q", cfg.KafkaBrokers)
	}
	// Safe defaults the rest of the code relies on.
	if cfg.DrainTimeout >= cfg.KafkaSessionTimeout || cfg.ShutdownTimeout <= cfg.DrainTimeout ||
		cfg.MaxAttempts < 1 || cfg.RetryBackoff <= 0 || cfg.RetryBackoffMax < cfg.RetryBackoff ||
		cfg.OutageAfter <= 0 || cfg.RetryBudget <= cfg.OutageAfter {
		t.Errorf("unsafe defaults: %+v", cfg)
	}
}

func TestValidConfigs(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"several brokers", map[string]string{"BILLING_KAFKA_BROKERS": "k1:9092,k2.example.com:9093,10.0.0.3:19092"}},
		{"key=value DSN", map[string]string{"BILLING_DATABASE_URL": "host=127.0.0.1 port=5432 user=u dbname=x"}},
		{"postgresql scheme", map[string]string{"BILLING_DATABASE_URL": "postgresql://u@h/x"}},
		{"https provider with path", map[string]string{"BILLING_PAYMENT_URL": "https://pay.example.com/v1"}},
		{"retention exactly 24h", map[string]string{"BILLING_DEDUP_RETENTION": "24h"}},
		{"commit interval", map[string]string{"BILLING_KAFKA_COMMIT_INTERVAL": "1s"}},
		{"debug logs", map[string]string{"BILLING_LOG_LEVEL": "debug"}},
		{"attempts alone decide", map[string]string{"BILLING_RETRY_BUDGET": "0s"}},
		{"no outage detection by time", map[string]string{"BILLING_OUTAGE_AFTER": "0s", "BILLING_RETRY_BUDGET": "10s", "BILLING_PARK_AFTER": "0s"}},
		{"parking off", map[string]string{"BILLING_PARK_AFTER": "0s"}},
		{"parking soon", map[string]string{"BILLING_PARK_AFTER": "11s", "BILLING_OUTAGE_AFTER": "11s"}},
		{"short timeouts", map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "6s", "BILLING_KAFKA_REBALANCE_TIMEOUT": "10s",
			"BILLING_DRAIN_TIMEOUT": "2s", "BILLING_SHUTDOWN_TIMEOUT": "5s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, validEnv, tt.env)
			if _, err := loadAndValidate(); err != nil {
				t.Errorf("rejected: %v", err)
			}
		})
	}
}

// Every configuration error is one line that starts with the variable to
// fix (SPEC §2).
func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
	}{
		{"missing database URL", map[string]string{"BILLING_DATABASE_URL": unset}, "BILLING_DATABASE_URL"},
		{"empty database URL", map[string]string{"BILLING_DATABASE_URL": ""}, "BILLING_DATABASE_URL"},
		{"database URL of another scheme", map[string]string{"BILLING_DATABASE_URL": "mysql://u@h/x"}, "BILLING_DATABASE_URL"},
		{"pool size negative", map[string]string{"BILLING_DB_MAX_CONNS": "-1"}, "BILLING_DB_MAX_CONNS"},
		{"pool size not a number", map[string]string{"BILLING_DB_MAX_CONNS": "lots"}, "BILLING_DB_MAX_CONNS"},
		{"pool size overflows int32", map[string]string{"BILLING_DB_MAX_CONNS": "99999999999"}, "BILLING_DB_MAX_CONNS"},

		{"missing brokers", map[string]string{"BILLING_KAFKA_BROKERS": unset}, "BILLING_KAFKA_BROKERS"},
		{"broker without port", map[string]string{"BILLING_KAFKA_BROKERS": "localhost"}, "BILLING_KAFKA_BROKERS"},
		{"broker without host", map[string]string{"BILLING_KAFKA_BROKERS": ":9092"}, "BILLING_KAFKA_BROKERS"},
		{"broker port zero", map[string]string{"BILLING_KAFKA_BROKERS": "k:0"}, "BILLING_KAFKA_BROKERS"},
		{"broker port too large", map[string]string{"BILLING_KAFKA_BROKERS": "k:65536"}, "BILLING_KAFKA_BROKERS"},
		{"broker port not a number", map[string]string{"BILLING_KAFKA_BROKERS": "k:http"}, "BILLING_KAFKA_BROKERS"},
		{"broker URL", map[string]string{"BILLING_KAFKA_BROKERS": "kafka://k:9092"}, "BILLING_KAFKA_BROKERS"},
		{"empty broker in list", map[string]string{"BILLING_KAFKA_BROKERS": "k1:9092,,k2:9092"}, "BILLING_KAFKA_BROKERS"},
		{"trailing comma", map[string]string{"BILLING_KAFKA_BROKERS": "k1:9092,"}, "BILLING_KAFKA_BROKERS"},
		{"bad broker after a good one", map[string]string{"BILLING_KAFKA_BROKERS": "k1:9092,k2"}, "BILLING_KAFKA_BROKERS"},

		{"same topic for source and DLQ", map[string]string{"BILLING_KAFKA_DLQ_TOPIC": "order-service.order.confirmed"}, "BILLING_KAFKA_DLQ_TOPIC"},
		{"same explicit topics", map[string]string{"BILLING_KAFKA_TOPIC": "t", "BILLING_KAFKA_DLQ_TOPIC": "t"}, "BILLING_KAFKA_DLQ_TOPIC"},
		{"topic with a space", map[string]string{"BILLING_KAFKA_TOPIC": "orders confirmed"}, "BILLING_KAFKA_TOPIC"},
		{"empty topic", map[string]string{"BILLING_KAFKA_TOPIC": ""}, "BILLING_KAFKA_TOPIC"},
		{"DLQ topic too long", map[string]string{"BILLING_KAFKA_DLQ_TOPIC": strings.Repeat("d", 250)}, "BILLING_KAFKA_DLQ_TOPIC"},
		{"empty group", map[string]string{"BILLING_KAFKA_GROUP_ID": ""}, "BILLING_KAFKA_GROUP_ID"},

		{"duration without unit", map[string]string{"BILLING_PAYMENT_TIMEOUT": "10"}, "BILLING_PAYMENT_TIMEOUT"},
		{"duration garbage", map[string]string{"BILLING_DRAIN_TIMEOUT": "soon"}, "BILLING_DRAIN_TIMEOUT"},
		{"duration with a newline", map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "30s\nrm -rf"}, "BILLING_KAFKA_SESSION_TIMEOUT"},
		{"commit interval negative", map[string]string{"BILLING_KAFKA_COMMIT_INTERVAL": "-1s"}, "BILLING_KAFKA_COMMIT_INTERVAL"},
		{"commit interval too long", map[string]string{"BILLING_KAFKA_COMMIT_INTERVAL": "2m"}, "BILLING_KAFKA_COMMIT_INTERVAL"},
		{"session timeout below one second", map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "500ms", "BILLING_DRAIN_TIMEOUT": "100ms"}, "BILLING_KAFKA_SESSION_TIMEOUT"},
		{"drain equal to session timeout", map[string]string{"BILLING_DRAIN_TIMEOUT": "30s", "BILLING_SHUTDOWN_TIMEOUT": "60s"}, "BILLING_DRAIN_TIMEOUT"},
		{"drain above session timeout", map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "10s", "BILLING_DRAIN_TIMEOUT": "12s", "BILLING_SHUTDOWN_TIMEOUT": "60s"}, "BILLING_DRAIN_TIMEOUT"},
		{"drain equal to rebalance timeout", map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "45s", "BILLING_KAFKA_REBALANCE_TIMEOUT": "20s", "BILLING_DRAIN_TIMEOUT": "20s", "BILLING_SHUTDOWN_TIMEOUT": "60s"}, "BILLING_DRAIN_TIMEOUT"},
		{"drain zero", map[string]string{"BILLING_DRAIN_TIMEOUT": "0s"}, "BILLING_DRAIN_TIMEOUT"},
		{"heartbeat a third of the session timeout", map[string]string{"BILLING_KAFKA_HEARTBEAT_INTERVAL": "2s"}, "BILLING_KAFKA_HEARTBEAT_INTERVAL"},
		{"heartbeat zero", map[string]string{"BILLING_KAFKA_HEARTBEAT_INTERVAL": "0s"}, "BILLING_KAFKA_HEARTBEAT_INTERVAL"},
		{"shutdown not above drain", map[string]string{"BILLING_SHUTDOWN_TIMEOUT": "3s"}, "BILLING_SHUTDOWN_TIMEOUT"},
		{"lag interval too short", map[string]string{"BILLING_KAFKA_LAG_INTERVAL": "100ms"}, "BILLING_KAFKA_LAG_INTERVAL"},

		{"missing payment URL", map[string]string{"BILLING_PAYMENT_URL": unset}, "BILLING_PAYMENT_URL"},
		{"payment URL not a URL", map[string]string{"BILLING_PAYMENT_URL": "pay.example.com"}, "BILLING_PAYMENT_URL"},
		{"payment URL relative", map[string]string{"BILLING_PAYMENT_URL": "/payments"}, "BILLING_PAYMENT_URL"},
		{"payment URL of another scheme", map[string]string{"BILLING_PAYMENT_URL": "ftp://pay.example.com"}, "BILLING_PAYMENT_URL"},
		{"payment URL without host", map[string]string{"BILLING_PAYMENT_URL": "https://"}, "BILLING_PAYMENT_URL"},
		{"payment URL unparsable", map[string]string{"BILLING_PAYMENT_URL": "http://[::1"}, "BILLING_PAYMENT_URL"},
		{"payment timeout zero", map[string]string{"BILLING_PAYMENT_TIMEOUT": "0s"}, "BILLING_PAYMENT_TIMEOUT"},
		{"payment client unknown", map[string]string{"BILLING_PAYMENT_CLIENT": "curl"}, "BILLING_PAYMENT_CLIENT"},
		{"payment client in capitals", map[string]string{"BILLING_PAYMENT_CLIENT": "FastHTTP"}, "BILLING_PAYMENT_CLIENT"},
		{"attempts zero", map[string]string{"BILLING_MAX_ATTEMPTS": "0"}, "BILLING_MAX_ATTEMPTS"},
		{"attempts too many", map[string]string{"BILLING_MAX_ATTEMPTS": "101"}, "BILLING_MAX_ATTEMPTS"},
		{"attempts not a number", map[string]string{"BILLING_MAX_ATTEMPTS": "eight"}, "BILLING_MAX_ATTEMPTS"},
		{"backoff zero", map[string]string{"BILLING_RETRY_BACKOFF": "0s"}, "BILLING_RETRY_BACKOFF"},
		{"backoff max below backoff", map[string]string{"BILLING_RETRY_BACKOFF": "2s", "BILLING_RETRY_BACKOFF_MAX": "1s"}, "BILLING_RETRY_BACKOFF_MAX"},
		// Retry budget and outage detection by time.
		{"retry budget negative", map[string]string{"BILLING_RETRY_BUDGET": "-1m"}, "BILLING_RETRY_BUDGET"},
		{"retry budget above a day", map[string]string{"BILLING_RETRY_BUDGET": "25h"}, "BILLING_RETRY_BUDGET"},
		{"retry budget not a duration", map[string]string{"BILLING_RETRY_BUDGET": "30"}, "BILLING_RETRY_BUDGET"},
		{"retry budget not above outage time", map[string]string{"BILLING_RETRY_BUDGET": "1m", "BILLING_OUTAGE_AFTER": "1m", "BILLING_PARK_AFTER": "0s"}, "BILLING_RETRY_BUDGET"},
		{"park after not above the payment timeout", map[string]string{"BILLING_PARK_AFTER": "10s"}, "BILLING_PARK_AFTER"},
		{"park after not below the retry budget", map[string]string{"BILLING_PARK_AFTER": "30m"}, "BILLING_PARK_AFTER"},
		{"park after negative", map[string]string{"BILLING_PARK_AFTER": "-1s"}, "BILLING_PARK_AFTER"},
		{"park after below the outage time", map[string]string{"BILLING_PARK_AFTER": "15s", "BILLING_OUTAGE_AFTER": "1m"}, "BILLING_PARK_AFTER"},
		{"outage time negative", map[string]string{"BILLING_OUTAGE_AFTER": "-1s"}, "BILLING_OUTAGE_AFTER"},
		{"outage time above an hour", map[string]string{"BILLING_OUTAGE_AFTER": "2h", "BILLING_RETRY_BUDGET": "3h"}, "BILLING_OUTAGE_AFTER"},

		{"retention below 24h", map[string]string{"BILLING_DEDUP_RETENTION": "23h59m"}, "BILLING_DEDUP_RETENTION"},
		{"retention in days", map[string]string{"BILLING_DEDUP_RETENTION": "7d"}, "BILLING_DEDUP_RETENTION"},
		{"partitions ahead 1", map[string]string{"BILLING_DEDUP_PARTITIONS_AHEAD": "1"}, "BILLING_DEDUP_PARTITIONS_AHEAD"},
		{"partitions ahead 61", map[string]string{"BILLING_DEDUP_PARTITIONS_AHEAD": "61"}, "BILLING_DEDUP_PARTITIONS_AHEAD"},
		{"lock timeout zero", map[string]string{"BILLING_DEDUP_LOCK_TIMEOUT": "0s"}, "BILLING_DEDUP_LOCK_TIMEOUT"},
		{"retention interval too short", map[string]string{"BILLING_RETENTION_INTERVAL": "30s"}, "BILLING_RETENTION_INTERVAL"},
		{"log level unknown", map[string]string{"BILLING_LOG_LEVEL": "verbose"}, "BILLING_LOG_LEVEL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, validEnv, tt.env)
			_, err := loadAndValidate()
			if err == nil {
				t.Fatal("accepted")
			}
			checkConfigError(t, err.Error(), tt.wantVar)

			// run reports the same error, before any I/O.
			var stdout, stderr bytes.Buffer
			rerr := run(context.Background(), []string{"run"}, &stdout, &stderr)
			if rerr == nil || rerr.Error() != err.Error() {
				t.Errorf("run = %v, want %v", rerr, err)
			}
			if stdout.Len() != 0 || stderr.Len() != 0 {
				t.Errorf("output for a configuration error: %q %q", stdout.String(), stderr.String())
			}
		})
	}
}

// checkConfigError fails unless msg is one line starting with "name:" (or
// "name " for an error about two variables).
func checkConfigError(t *testing.T, msg, name string) {
	t.Helper()
	if strings.ContainsAny(msg, "\r\n") {
		t.Errorf("error is not one line: %q", msg)
	}
	if !strings.HasPrefix(msg, name+": ") && !strings.HasPrefix(msg, name+" ") {
		t.Errorf("error %q does not start with %s", msg, name)
	}
	if len(msg) <= len(name)+2 {
		t.Errorf("error %q says nothing about what is wrong", msg)
	}
}

// The brokers that pass validation are the ones Kafka gets: a space after
// a comma must not reach the dialer, which would look up " k2".
func TestBrokerListSpacesAreTrimmed(t *testing.T) {
	setEnv(t, validEnv, map[string]string{"BILLING_KAFKA_BROKERS": "127.0.0.1:9092, 127.0.0.1:9093"})
	cfg, err := loadAndValidate()
	if err != nil {
		// Rejecting the spaces with a clear message would be fine too.
		checkConfigError(t, err.Error(), "BILLING_KAFKA_BROKERS")
		return
	}
	for _, b := range cfg.KafkaBrokers {
		if b != strings.TrimSpace(b) {
			t.Fatalf("BILLING_KAFKA_BROKERS=%q passes validate() but %q, untrimmed, is what serve.go hands to kafka.TCP: validate and use must see the same list",
				os.Getenv("BILLING_KAFKA_BROKERS"), b)
		}
	}
}

// SPEC §3: the variables have the BILLING_ prefix. A DATABASE_URL or
// LOG_LEVEL meant for another program in the same pod must not be used.
func TestUnprefixedVariablesAreIgnored(t *testing.T) {
	setEnv(t, validEnv, map[string]string{"BILLING_DATABASE_URL": unset})
	t.Setenv("DATABASE_URL", "postgres://other-app@127.0.0.1/other")
	t.Setenv("LOG_LEVEL", "loud")
	cfg, err := loadAndValidate()
	if err == nil || cfg.DatabaseURL != "" {
		t.Fatalf("with BILLING_DATABASE_URL unset, the unprefixed DATABASE_URL is used (%q, err %v): envconfig falls back to a bare envconfig:\"NAME\" tag", cfg.DatabaseURL, err)
	}
	checkConfigError(t, err.Error(), "BILLING_DATABASE_URL")
}

// An IPv6 broker address is host:port too.
func TestIPv6Broker(t *testing.T) {
	setEnv(t, validEnv, map[string]string{"BILLING_KAFKA_BROKERS": "[::1]:9092,[fd00::2]:9093"})
	if _, err := loadAndValidate(); err != nil {
		t.Fatalf("bracketed IPv6 brokers are rejected: %v", err)
	}
}

func TestSecretFiles(t *testing.T) {
	dbURL := "postgres://u:S3cr3tPw@db.internal:5432/billing?sslmode=verify-full"
	setEnv(t, validEnv, map[string]string{
		"BILLING_DATABASE_URL":       unset,
		"BILLING_DATABASE_URL_FILE":  writeFile(t, "db-url", "  "+dbURL+"\n\n"),
		"BILLING_PAYMENT_TOKEN_FILE": writeFile(t, "token", "tok-S3cr3t\r\n"),
	})
	cfg, err := loadAndValidate()
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	if cfg.DatabaseURL != dbURL {
		t.Errorf("DatabaseURL = %q, want the trimmed file content", cfg.DatabaseURL)
	}
	if cfg.PaymentToken != "tok-S3cr3t" {
		t.Errorf("PaymentToken = %q, want the trimmed file content", cfg.PaymentToken)
	}
}

func TestSecretFileErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
	}{
		{"database URL and file both set", map[string]string{
			"BILLING_DATABASE_URL_FILE": writeFile(t, "db", "postgres://u:S3cr3tPw@h/x"),
		}, "BILLING_DATABASE_URL"},
		{"token and file both set", map[string]string{
			"BILLING_PAYMENT_TOKEN":      "tok-S3cr3t",
			"BILLING_PAYMENT_TOKEN_FILE": writeFile(t, "token", "tok-S3cr3t"),
		}, "BILLING_PAYMENT_TOKEN"},
		{"database URL file missing", map[string]string{
			"BILLING_DATABASE_URL":      unset,
			"BILLING_DATABASE_URL_FILE": filepath.Join(dir, "no-such-file"),
		}, "BILLING_DATABASE_URL_FILE"},
		{"token file missing", map[string]string{
			"BILLING_PAYMENT_TOKEN_FILE": filepath.Join(dir, "no-such-token"),
		}, "BILLING_PAYMENT_TOKEN_FILE"},
		{"token file is a directory", map[string]string{
			"BILLING_PAYMENT_TOKEN_FILE": dir,
		}, "BILLING_PAYMENT_TOKEN_FILE"},
		{"database URL file empty", map[string]string{
			"BILLING_DATABASE_URL":      unset,
			"BILLING_DATABASE_URL_FILE": writeFile(t, "empty", " \n\t\n"),
		}, "BILLING_DATABASE_URL_FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, validEnv, map[string]string{
				"BILLING_DATABASE_URL": "postgres://u:S3cr3tPw@h/x",
			}, tt.env)
			_, err := loadAndValidate()
			if err == nil {
				t.Fatal("accepted")
			}
			checkConfigError(t, err.Error(), tt.wantVar)
			for _, s := range []string{"S3cr3tPw", "tok-S3cr3t"} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q reveals a secret", err)
				}
			}
		})
	}
}

// No error and no output ever contains a secret, whatever else is wrong.
func TestSecretsNeverInErrorsOrOutput(t *testing.T) {
	const (
		pw    = "S3cr3tPw"
		token = "tok-S3cr3t"
	)
	secretURL := "postgres://u:" + pw + "@127.0.0.1:1/x"
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"migrate, database unreachable", []string{"migrate"}, nil},
		{"retention, database unreachable", []string{"retention"}, nil},
		{"run, database unreachable", []string{"run"}, nil},
		{"migrate, bad retention", []string{"migrate"}, map[string]string{"BILLING_DEDUP_RETENTION": "1h"}},
		{"migrate, bad pool size", []string{"migrate"}, map[string]string{"BILLING_DB_MAX_CONNS": "x"}},
		{"migrate, unparsable URL", []string{"migrate"}, map[string]string{"BILLING_DATABASE_URL": "postgres://u:" + pw + "@127.0.0.1:port/x"}},
		{"migrate, URL with a raw @ in the password", []string{"migrate"}, map[string]string{"BILLING_DATABASE_URL": "postgres://u:" + pw + "@x@127.0.0.1:1/x"}},
		{"migrate, password in query", []string{"migrate"}, map[string]string{"BILLING_DATABASE_URL": "postgres://127.0.0.1:1/x?user=u&password=" + pw}},
		{"migrate, key=value DSN", []string{"migrate"}, map[string]string{"BILLING_DATABASE_URL": "host=127.0.0.1 port=1 user=u password=" + pw + " dbname=x"}},
		{"migrate, URL not postgres", []string{"migrate"}, map[string]string{"BILLING_DATABASE_URL": "mysql://u:" + pw + "@h/x"}},
		{"run, missing brokers", []string{"run"}, map[string]string{"BILLING_KAFKA_BROKERS": unset}},
		{"run, bad payment URL", []string{"run"}, map[string]string{"BILLING_PAYMENT_URL": "ftp://h"}},
		{"run, secrets given twice", []string{"run"}, map[string]string{"BILLING_PAYMENT_TOKEN_FILE": "/nonexistent"}},
		{"run, secrets from files", []string{"run"}, map[string]string{
			"BILLING_DATABASE_URL": unset, "BILLING_PAYMENT_TOKEN": unset,
			"BILLING_DATABASE_URL_FILE":  "@db",
			"BILLING_PAYMENT_TOKEN_FILE": "@token",
		}},
		{"run, debug logs", []string{"run"}, map[string]string{"BILLING_LOG_LEVEL": "debug"}},
		{"dlq replay, missing brokers", []string{"dlq", "replay"}, map[string]string{"BILLING_KAFKA_BROKERS": unset}},
		{"dlq replay, secrets given twice", []string{"dlq", "replay", "--dry-run"}, map[string]string{"BILLING_DATABASE_URL_FILE": "@db"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range tt.env {
				switch v {
				case "@db":
					v = writeFile(t, "db", secretURL+"\n")
				case "@token":
					v = writeFile(t, "token", token+"\n")
				}
				env[k] = v
			}
			setEnv(t, validEnv, map[string]string{
				"BILLING_DATABASE_URL":  secretURL,
				"BILLING_PAYMENT_TOKEN": token,
			}, env)
			var stdout, stderr bytes.Buffer
			// run waits for an unreachable database (unready) until it
			// is stopped: a clean stop, logged with what it waited for.
			limit := 30 * time.Second
			if tt.args[0] == "run" {
				limit = 3 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			defer cancel()
			err := run(ctx, tt.args, &stdout, &stderr)
			switch {
			case err == nil && tt.args[0] == "run" && strings.Contains(stderr.String(), "stopped before ready"):
				err = errors.New(stderr.String()) // what it said instead
			case err == nil:
				t.Fatal("succeeded with a broken configuration")
			}
			for _, s := range []string{pw, token} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error reveals %q: %v", s, err)
				}
				if strings.Contains(stdout.String(), s) || strings.Contains(stderr.String(), s) {
					t.Errorf("output reveals %q:\nstdout: %s\nstderr: %s", s, stdout.String(), stderr.String())
				}
			}
		})
	}
}

// Every problem at once: two unparsable values, or a secret file that
// cannot be read and two invalid values, are all named in one line, each
// with its variable (and the path, for the file).
func TestConfigErrorsAllAtOnce(t *testing.T) {
	setEnv(t, validEnv, map[string]string{"BILLING_CONCURRENCY": "many", "BILLING_PAYMENT_TIMEOUT": "10"})
	_, err := configFor(need{kafka: true, payment: true})
	if err == nil || !strings.Contains(err.Error(), "BILLING_CONCURRENCY: cannot parse") || !strings.Contains(err.Error(), "BILLING_PAYMENT_TIMEOUT: cannot parse") {
		t.Errorf("two unparsable values: %v, want both named", err)
	}
	missing := filepath.Join(t.TempDir(), "no-such-token")
	setEnv(t, validEnv, map[string]string{"BILLING_PAYMENT_TOKEN_FILE": missing, "BILLING_MAX_ATTEMPTS": "0", "BILLING_KAFKA_BROKERS": "k"})
	_, err = configFor(need{kafka: true, payment: true})
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	checkConfigError(t, msg, "BILLING_PAYMENT_TOKEN_FILE")
	for _, want := range []string{"BILLING_PAYMENT_TOKEN_FILE: cannot read " + missing, "BILLING_MAX_ATTEMPTS:", "BILLING_KAFKA_BROKERS:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
}
