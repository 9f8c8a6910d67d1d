package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/kafkaconn"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// saslPassword is the SASL password of these tests; it must never show.
const saslPassword = "sasl-Pw-9fXq2"

// testCA is a throw-away CA and a server certificate it signed for
// 127.0.0.1 and localhost.
type testCA struct {
	file   string // the CA certificate, PEM
	pool   *x509.CertPool
	server tls.Certificate
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey, srvKey := key(), key()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "billing test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	c := testCA{file: writeFile(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))),
		pool: x509.NewCertPool()}
	c.pool.AddCert(ca)
	c.server = tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
	return c
}

// Each wrong Kafka security setting is one line naming the variable,
// reported by run and by dlq replay before any output or connection, and no
// error carries the password.
func TestKafkaSecurityConfigErrors(t *testing.T) {
	ca := newTestCA(t)
	tlsOn := map[string]string{"BILLING_KAFKA_TLS": "true"}
	scram := map[string]string{"BILLING_KAFKA_SASL_MECHANISM": "scram-sha-256", "BILLING_KAFKA_SASL_USERNAME": "billing",
		"BILLING_KAFKA_SASL_PASSWORD": saslPassword}
	with := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
	}{
		{"TLS not a bool", map[string]string{"BILLING_KAFKA_TLS": "yes please"}, "BILLING_KAFKA_TLS"},
		{"unknown mechanism", with(scram, map[string]string{"BILLING_KAFKA_SASL_MECHANISM": "gssapi"}), "BILLING_KAFKA_SASL_MECHANISM"},
		{"CA without TLS", map[string]string{"BILLING_KAFKA_TLS_CA_FILE": ca.file}, "BILLING_KAFKA_TLS_CA_FILE"},
		{"server name without TLS", map[string]string{"BILLING_KAFKA_TLS_SERVER_NAME": "kafka"}, "BILLING_KAFKA_TLS_SERVER_NAME"},
		{"client cert without TLS", map[string]string{"BILLING_KAFKA_TLS_CERT_FILE": ca.file, "BILLING_KAFKA_TLS_KEY_FILE": ca.file}, "BILLING_KAFKA_TLS_CERT_FILE"},
		{"cert without key", with(tlsOn, map[string]string{"BILLING_KAFKA_TLS_CERT_FILE": ca.file}), "BILLING_KAFKA_TLS_KEY_FILE"},
		{"key without cert", with(tlsOn, map[string]string{"BILLING_KAFKA_TLS_KEY_FILE": ca.file}), "BILLING_KAFKA_TLS_CERT_FILE"},
		{"user without mechanism", map[string]string{"BILLING_KAFKA_SASL_USERNAME": "billing"}, "BILLING_KAFKA_SASL_MECHANISM"},
		{"password without mechanism", map[string]string{"BILLING_KAFKA_SASL_PASSWORD": saslPassword}, "BILLING_KAFKA_SASL_MECHANISM"},
		{"mechanism without user", with(scram, map[string]string{"BILLING_KAFKA_SASL_USERNAME": unset}), "BILLING_KAFKA_SASL_USERNAME"},
		{"mechanism without password", with(scram, map[string]string{"BILLING_KAFKA_SASL_PASSWORD": unset}), "BILLING_KAFKA_SASL_PASSWORD"},
		{"plain without TLS", with(scram, map[string]string{"BILLING_KAFKA_SASL_MECHANISM": "plain"}), "BILLING_KAFKA_SASL_MECHANISM"},
		{"password twice", with(scram, map[string]string{"BILLING_KAFKA_SASL_PASSWORD_FILE": ca.file}), "BILLING_KAFKA_SASL_PASSWORD"},
		{"password file missing", with(scram, map[string]string{"BILLING_KAFKA_SASL_PASSWORD": unset,
			"BILLING_KAFKA_SASL_PASSWORD_FILE": missing}), "BILLING_KAFKA_SASL_PASSWORD_FILE"},
		{"unreadable CA", with(tlsOn, scram, map[string]string{"BILLING_KAFKA_TLS_CA_FILE": missing}), "BILLING_KAFKA_TLS_CA_FILE"},
		{"CA not PEM", with(tlsOn, scram, map[string]string{"BILLING_KAFKA_TLS_CA_FILE": writeFile(t, "ca.txt", "not PEM")}), "BILLING_KAFKA_TLS_CA_FILE"},
		{"client key not matching", with(tlsOn, scram, map[string]string{"BILLING_KAFKA_TLS_CERT_FILE": ca.file,
			"BILLING_KAFKA_TLS_KEY_FILE": writeKey(t)}), "BILLING_KAFKA_TLS_KEY_FILE"},
		{"SCRAM password with a control character", with(tlsOn, scram, map[string]string{"BILLING_KAFKA_SASL_PASSWORD": saslPassword + "\a"}),
			"BILLING_KAFKA_SASL_PASSWORD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, args := range [][]string{{"run"}, {"dlq", "replay"}} {
				setEnv(t, validEnv, tt.env)
				var stdout, stderr bytes.Buffer
				err := run(context.Background(), args, &stdout, &stderr)
				if err == nil {
					t.Fatalf("%v accepted", args)
				}
				checkConfigError(t, err.Error(), tt.wantVar)
				if strings.Contains(err.Error(), saslPassword) {
					t.Errorf("%v: error reveals the password: %v", args, err)
				}
				if stdout.Len() != 0 || stderr.Len() != 0 {
					t.Errorf("%v: output for a configuration error: %q %q", args, stdout.String(), stderr.String())
				}
			}
		})
	}
}

// writeKey writes a fresh private key that matches no certificate.
func writeKey(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(k)
	return writeFile(t, "key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
}

func TestKafkaSecurityValidConfigs(t *testing.T) {
	ca := newTestCA(t)
	for name, env := range map[string]map[string]string{
		"TLS with system roots": {"BILLING_KAFKA_TLS": "true"},
		"TLS with CA and name":  {"BILLING_KAFKA_TLS": "1", "BILLING_KAFKA_TLS_CA_FILE": ca.file, "BILLING_KAFKA_TLS_SERVER_NAME": "kafka.internal"},
		"SCRAM without TLS": {"BILLING_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "BILLING_KAFKA_SASL_USERNAME": "billing",
			"BILLING_KAFKA_SASL_PASSWORD": saslPassword},
		"plain over TLS, password file": {"BILLING_KAFKA_TLS": "true", "BILLING_KAFKA_SASL_MECHANISM": "plain",
			"BILLING_KAFKA_SASL_USERNAME": "billing", "BILLING_KAFKA_SASL_PASSWORD_FILE": writeFile(t, "pw", saslPassword+"\n")},
		"mechanism none":           {"BILLING_KAFKA_SASL_MECHANISM": "none"},
		"https provider with a CA": {"BILLING_PAYMENT_URL": "https://pay.example.com", "BILLING_PAYMENT_CA_FILE": ca.file},
	} {
		t.Run(name, func(t *testing.T) {
			setEnv(t, validEnv, env)
			cfg, err := loadAndValidate()
			if err != nil {
				t.Fatalf("rejected: %v", err)
			}
			if _, err := kafkaConns(cfg, nil); err != nil {
				t.Errorf("kafkaConns: %v", err)
			}
			if _, err := paymentTLS(cfg); err != nil {
				t.Errorf("paymentTLS: %v", err)
			}
			if env["BILLING_KAFKA_SASL_PASSWORD_FILE"] != "" && cfg.KafkaSASLPassword != saslPassword {
				t.Errorf("password from file = %q", cfg.KafkaSASLPassword)
			}
		})
	}
}

// The help table lists the security variables under these exact names
// (split_words would turn a field named KafkaTLSCAFile into TLSCA_FILE).
func TestSecurityVariableNames(t *testing.T) {
	cleanEnv(t)
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"help"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	rows := usageRows(t, stdout.String())
	for name, def := range map[string]string{
		"BILLING_KAFKA_TLS": "false", "BILLING_KAFKA_TLS_CA_FILE": "", "BILLING_KAFKA_TLS_CERT_FILE": "",
		"BILLING_KAFKA_TLS_KEY_FILE": "", "BILLING_KAFKA_TLS_SERVER_NAME": "", "BILLING_KAFKA_SASL_MECHANISM": "none",
		"BILLING_KAFKA_SASL_USERNAME": "", "BILLING_KAFKA_SASL_PASSWORD": "", "BILLING_KAFKA_SASL_PASSWORD_FILE": "",
		"BILLING_PAYMENT_CA_FILE": "",
	} {
		row, ok := rows[name]
		if !ok {
			t.Errorf("%s missing from help", name)
			continue
		}
		if row.def != def {
			t.Errorf("%s: default %q, want %q", name, row.def, def)
		}
	}
}

// BILLING_PAYMENT_CA_FILE makes an https provider signed by a private CA
// trusted; without it the same provider fails as Systemic (a pause, never
// a dead letter), and it is refused for an http URL. Both clients of
// BILLING_PAYMENT_CLIENT are checked.
func TestPaymentCAFile(t *testing.T) {
	for _, client := range []string{"nethttp", "fasthttp"} {
		t.Run(client, func(t *testing.T) { testPaymentCAFile(t, client) })
	}
}

func testPaymentCAFile(t *testing.T, client string) {
	var hits int
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		_, _ = io.WriteString(w, `{"charge_id":"ch_private_ca"}`)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := writeFile(t, "provider-ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))

	charge := func(env map[string]string) error {
		t.Helper()
		setEnv(t, validEnv, map[string]string{"BILLING_PAYMENT_URL": srv.URL, "BILLING_PAYMENT_CLIENT": client}, env)
		cfg, err := loadAndValidate()
		if err != nil {
			t.Fatal(err)
		}
		tlsCfg, err := paymentTLS(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c, err := payment.New(payment.Config{Engine: payment.Engine(cfg.PaymentClient), BaseURL: cfg.PaymentURL, Timeout: 5 * time.Second, TLS: tlsCfg})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseIdleConnections()
		_, err = c.Charge(t.Context(), payment.Charge{IdempotencyKey: uuid.NewString(), OrderID: 1, CustomerID: 2, Amount: 100})
		return err
	}
	if err := charge(map[string]string{"BILLING_PAYMENT_CA_FILE": caFile}); err != nil {
		t.Fatalf("with the CA file: %v", err)
	}
	err := charge(nil)
	if err == nil || fault.KindOf(err) != fault.Systemic {
		t.Fatalf("without the CA file: %v (kind %v), want a Systemic TLS error", err, fault.KindOf(err))
	}
	var verr *tls.CertificateVerificationError
	if !errors.As(err, &verr) {
		t.Errorf("error %v does not carry the certificate verification failure", err)
	}
	if hits != 1 {
		t.Errorf("provider got %d requests, want 1 (the trusted one)", hits)
	}

	for name, tt := range map[string]struct {
		env     map[string]string
		wantVar string
	}{
		"CA with an http provider": {map[string]string{"BILLING_PAYMENT_URL": "http://127.0.0.1:1", "BILLING_PAYMENT_CA_FILE": caFile}, "BILLING_PAYMENT_CA_FILE"},
		"CA file missing":          {map[string]string{"BILLING_PAYMENT_CA_FILE": filepath.Join(t.TempDir(), "none.pem")}, "BILLING_PAYMENT_CA_FILE"},
		"CA file not PEM":          {map[string]string{"BILLING_PAYMENT_CA_FILE": writeFile(t, "x", "hello")}, "BILLING_PAYMENT_CA_FILE"},
	} {
		t.Run(name, func(t *testing.T) {
			setEnv(t, validEnv, map[string]string{"BILLING_PAYMENT_URL": srv.URL}, tt.env)
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), []string{"run"}, &stdout, &stderr)
			if err == nil {
				t.Fatal("accepted")
			}
			checkConfigError(t, err.Error(), tt.wantVar)
			if stdout.Len() != 0 || stderr.Len() != 0 {
				t.Errorf("output for a configuration error: %q %q", stdout.String(), stderr.String())
			}
		})
	}
}

// secureKfake is an in-process broker that accepts only TLS (certificates
// of ca) and SCRAM-SHA-512 for user billing.
func secureKfake(t *testing.T, ca testCA, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{ca.server}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "billing", saslPassword),
		kfake.SeedTopics(1, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func secureEnv(ca testCA, brokers []string, password string) map[string]string {
	return map[string]string{
		"BILLING_KAFKA_BROKERS":        strings.Join(brokers, ","),
		"BILLING_KAFKA_TLS":            "true",
		"BILLING_KAFKA_TLS_CA_FILE":    ca.file,
		"BILLING_KAFKA_SASL_MECHANISM": "scram-sha-512",
		"BILLING_KAFKA_SASL_USERNAME":  "billing",
		"BILLING_KAFKA_SASL_PASSWORD":  password,
	}
}

// run and dlq replay stop at once, with one line naming the variables to
// check, when the broker rejects the password or its certificate does not
// verify; neither the error nor the logs hold the password.
func TestKafkaRejectsStartup(t *testing.T) {
	ca := newTestCA(t)
	brokers := secureKfake(t, ca)
	other := newTestCA(t)
	wrong := "wrong-" + saslPassword
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"wrong password", secureEnv(ca, brokers, wrong), "SASL authentication failed"},
		{"untrusted broker certificate", secureEnv(other, brokers, saslPassword), "TLS handshake failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// dlq replay first: run needs Postgres, whose absence skips.
			for _, args := range [][]string{{"dlq", "replay", "--dry-run"}, {"run"}} {
				env := map[string]string{"BILLING_HTTP_ADDR": "127.0.0.1:0"}
				if args[0] == "run" {
					env["BILLING_DATABASE_URL"] = pgtest.NewDatabase(t)
				}
				setEnv(t, validEnv, tt.env, env)
				var stdout, stderr bytes.Buffer
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				start := time.Now()
				err := run(ctx, args, &stdout, &stderr)
				cancel()
				if err == nil {
					t.Fatalf("%v succeeded", args)
				}
				if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "BILLING_KAFKA_") {
					t.Errorf("%v: %v; want %q and the variables to check", args, err, tt.want)
				}
				if time.Since(start) > 20*time.Second {
					t.Errorf("%v: took %s to give up on a configuration error", args, time.Since(start))
				}
				for _, s := range []string{saslPassword, wrong} {
					if strings.Contains(err.Error(), s) || strings.Contains(stdout.String(), s) || strings.Contains(stderr.String(), s) {
						t.Errorf("%v: the password shows: %v\n%s%s", args, err, stdout.String(), stderr.String())
					}
				}
				t.Logf("%v (%s): %v", args, time.Since(start).Round(time.Millisecond), err)
			}
		})
	}
}

// run consumes, charges, dead-letters and measures lag through a broker
// that accepts only TLS and SCRAM: every Kafka client of the process (group,
// partition readers, DLQ writer, lag client) is configured alike.
func TestRunOverTLSAndSASL(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ca := newTestCA(t)
	topic, dlqTopic := "orders-secure", "orders-secure.dlq"
	brokers := secureKfake(t, ca, topic, dlqTopic)
	prov := &provider{}
	srv := httptest.NewServer(prov)
	t.Cleanup(srv.Close)
	setEnv(t, secureEnv(ca, brokers, saslPassword), runTimings, map[string]string{
		"BILLING_DATABASE_URL":       dbURL,
		"BILLING_KAFKA_TOPIC":        topic,
		"BILLING_KAFKA_DLQ_TOPIC":    dlqTopic,
		"BILLING_PAYMENT_URL":        srv.URL,
		"BILLING_HTTP_ADDR":          "127.0.0.1:0",
		"BILLING_KAFKA_LAG_INTERVAL": "1s",
	})
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	svc := startRun(t)
	ctx, stderr := svc.ctx, svc.stderr

	conns, err := kafkaconn.New(kafkaconn.Config{TLS: true, CAFile: ca.file, Mechanism: kafkaconn.ScramSHA512,
		Username: "billing", Password: saslPassword})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	valid := fmt.Appendf(nil, `{"event_id":%q,"event_type":"order.confirmed.v1","occurred_at":%q,"order_id":2001,"customer_id":42,"total_amount":"10.00"}`,
		id, time.Now().UTC().Format(time.RFC3339))
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: conns.Transport, BatchTimeout: time.Millisecond}
	t.Cleanup(func() { _ = w.Close() })
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := w.WriteMessages(wctx, kafka.Message{Key: []byte("2001"), Value: valid}, kafka.Message{Key: []byte("x"), Value: []byte("garbage")}); err != nil {
		t.Fatalf("produce: %v", err)
	}

	addr := svc.httpAddr(t)
	pool := pgtest.Open(t, dbURL)
	poll.Until(t, 60*time.Second, "the charge row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM charge WHERE event_id = $1", id).Scan(&n)
		return n == 1
	})
	// The lag gauge comes from the lag client, the committed offset 2 from
	// the group: both through TLS and SASL.
	group := cmp.Or(os.Getenv("BILLING_KAFKA_GROUP_ID"), "billing-order-confirmed")
	lag := fmt.Sprintf(`billing_kafka_consumer_lag{group=%q,partition="0",topic=%q} 0`, group, topic)
	poll.Until(t, 60*time.Second, lag, func() bool {
		_, body := httpGet("http://" + addr + "/metrics")
		return strings.Contains(body, lag+"\n") && strings.Contains(body, `billing_dlq_total{reason="invalid"} 1`+"\n")
	})

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: dlqTopic, Partition: 0, Dialer: conns.Dialer, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = r.Close() })
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	m, err := r.ReadMessage(rctx)
	if err != nil {
		t.Fatalf("read the DLQ: %v", err)
	}
	if string(m.Value) != "garbage" {
		t.Errorf("DLQ record %q", m.Value)
	}
	for _, h := range m.Headers {
		if h.Key == dlq.HeaderReason && string(h.Value) != "invalid" {
			t.Errorf("dlq-reason %q", h.Value)
		}
	}

	if err := svc.stop(t); err != nil {
		t.Fatalf("run: %v", err)
	}
	if strings.Contains(stderr.String(), saslPassword) {
		t.Errorf("the logs reveal the SASL password:\n%s", stderr.String())
	}
}

// pgx takes TLS from the URL: sslmode=verify-full is honoured, so the
// scratch Postgres, which has no TLS, is refused rather than used in clear
// (with sslmode=disable the same URL connects), and the error holds no
// password.
func TestDatabaseSSLModeHonoured(t *testing.T) {
	u, err := url.Parse(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "pgPw-7xQ2")
	q := u.Query()
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", newTestCA(t).file)
	u.RawQuery = q.Encode()
	setEnv(t, map[string]string{"BILLING_DATABASE_URL": u.String()})
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"migrate"}, &stdout, &stderr)
	if err == nil {
		t.Fatal("migrate connected without TLS despite sslmode=verify-full")
	}
	if !strings.Contains(err.Error(), "TLS") {
		t.Errorf("error does not say TLS was refused: %v", err)
	}
	if strings.Contains(err.Error()+stderr.String(), "pgPw-7xQ2") {
		t.Errorf("error reveals the password: %v", err)
	}
	t.Log(err)
}
