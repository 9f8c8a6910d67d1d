package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/logtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// secureBroker is the broker of scripts/kafka-secure.sh: SASL_SSL (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512, one user each), SSL with a required client
// certificate, and a PLAINTEXT listener for the harness only.
type secureBroker struct {
	plaintext, saslSSL, mtls   string
	caFile, clientCert, client string // client: the client key file
	users, passwords           map[string]string
}

// startSecureBroker starts a broker of its own (own directory, free ports:
// the plaintext broker of the other suites is not touched) and stops it when
// the test ends. Under CI a broker that does not start fails the test;
// elsewhere only a missing java or openssl skips it.
func startSecureBroker(t *testing.T) *secureBroker {
	t.Helper()
	if os.Getenv("CI") == "" {
		for _, tool := range []string{"java", "openssl"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("%s not found; the secured broker needs it (CI fails instead)", tool)
			}
		}
	}
	port := func() string {
		_, p, err := net.SplitHostPort(kafkatest.FreePort(t))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := append(os.Environ(), "KAFKA_DIR="+t.TempDir(), "KAFKA_PORT="+port(), "KAFKA_CONTROLLER_PORT="+port(),
		"KAFKA_SASL_SSL_PORT="+port(), "KAFKA_MTLS_PORT="+port())
	script := func(ctx context.Context, arg string) (string, error) {
		cmd := exec.CommandContext(ctx, "../scripts/kafka-secure.sh", arg)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("scripts/kafka-secure.sh %s: %v\n%s", arg, err, stderr.String())
		}
		return string(out), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := script(ctx, "start")
	t.Cleanup(func() {
		if _, err := script(context.Background(), "stop"); err != nil {
			t.Errorf("stop the secured broker: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("the secured broker did not start: %v", err)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	b := &secureBroker{
		plaintext: kv["KAFKA_SECURE_PLAINTEXT"], saslSSL: kv["KAFKA_SECURE_SASL_SSL"], mtls: kv["KAFKA_SECURE_MTLS"],
		caFile: kv["KAFKA_SECURE_CA_FILE"], clientCert: kv["KAFKA_SECURE_CLIENT_CERT_FILE"], client: kv["KAFKA_SECURE_CLIENT_KEY_FILE"],
		users: map[string]string{}, passwords: map[string]string{},
	}
	for mech, key := range map[string]string{"plain": "PLAIN", "scram-sha-256": "SCRAM_SHA_256", "scram-sha-512": "SCRAM_SHA_512"} {
		b.users[mech], b.passwords[mech] = kv["KAFKA_SECURE_"+key+"_USER"], kv["KAFKA_SECURE_"+key+"_PASSWORD"]
		if b.users[mech] == "" || b.passwords[mech] == "" {
			t.Fatalf("kafka-secure.sh printed no %s user:\n%s", mech, out)
		}
	}
	if b.plaintext == "" || b.saslSSL == "" || b.mtls == "" || b.caFile == "" {
		t.Fatalf("kafka-secure.sh output incomplete:\n%s", out)
	}
	t.Logf("secured broker up in %s: SASL_SSL %s, SSL+client cert %s", time.Since(start).Round(100*time.Millisecond), b.saslSSL, b.mtls)
	return b
}

// saslEnv is the environment that points the service at the SASL_SSL
// listener with mechanism's user; it comes after world.env, so its
// BILLING_KAFKA_BROKERS wins (os/exec keeps the last value).
func (b *secureBroker) saslEnv(mechanism, password string) []string {
	return []string{
		"BILLING_KAFKA_BROKERS=" + b.saslSSL,
		"BILLING_KAFKA_TLS=true",
		"BILLING_KAFKA_TLS_CA_FILE=" + b.caFile,
		"BILLING_KAFKA_SASL_MECHANISM=" + mechanism,
		"BILLING_KAFKA_SASL_USERNAME=" + b.users[mechanism],
		"BILLING_KAFKA_SASL_PASSWORD=" + password,
	}
}

// TestKafkaSecurity runs the service binary against a real Apache Kafka
// that accepts only encrypted, authenticated clients on the listeners the
// service is given: each SASL mechanism over TLS and a TLS client
// certificate carry a workload to SPEC §9's end state (the consumer group,
// the partition readers, the DLQ writer, the lag client and dlq replay all
// connect), a wrong password or an untrusted broker stop startup with one
// clear line, and no secret ever appears in the output, the DLQ records or
// /metrics.
func TestKafkaSecurity(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end security test against a secured Apache Kafka; runs in make test")
	}
	b := startSecureBroker(t)

	for _, mech := range []string{"plain", "scram-sha-256", "scram-sha-512"} {
		t.Run("SASL_SSL "+mech, func(t *testing.T) {
			w := newWorldOn(t, []string{b.plaintext}, pgtest.NewDatabase(t), 2, paysim.Faults{})
			env := b.saslEnv(mech, b.passwords[mech])
			if mech == "scram-sha-512" { // the password from a mounted file
				env[len(env)-1] = "BILLING_KAFKA_SASL_PASSWORD_FILE=" + writeSecret(t, b.passwords[mech])
			}
			first := time.Now().UnixMilli()*10 + 1
			plan := mustPlan(t, harness.Spec{Orders: 20, FirstOrderID: first, DuplicateRate: 0.2, Invalid: 2, Seed: 3, Now: time.Now()})
			if err := harness.Produce(context.Background(), w.brokers, w.topic, plan.Records); err != nil {
				t.Fatal(err)
			}
			p := w.start(t, env, "run")
			w.waitDrained(t, p, 2*time.Minute)
			report(t, w.verify(t, plan, first, 20))
			if err := p.Stop(30 * time.Second); err != nil {
				t.Errorf("stop: %v", err)
			}
			if mech == "scram-sha-256" {
				// dlq replay's group, reader and admin client too.
				out, err := w.replay(t, env, "--dry-run", "--reason", "invalid")
				if err != nil {
					t.Fatalf("dlq replay --dry-run --reason invalid: %v\n%s", err, out)
				}
				wantRow(t, out, "invalid", 2, 0, 0)
			}
		})
	}

	t.Run("SSL client certificate", func(t *testing.T) {
		w := newWorldOn(t, []string{b.plaintext}, pgtest.NewDatabase(t), 1, paysim.Faults{})
		first := time.Now().UnixMilli()*10 + 2
		plan := mustPlan(t, harness.Spec{Orders: 10, FirstOrderID: first, Invalid: 1, Seed: 4, Now: time.Now()})
		if err := harness.Produce(context.Background(), w.brokers, w.topic, plan.Records); err != nil {
			t.Fatal(err)
		}
		p := w.start(t, []string{
			"BILLING_KAFKA_BROKERS=" + b.mtls, "BILLING_KAFKA_TLS=true", "BILLING_KAFKA_TLS_CA_FILE=" + b.caFile,
			"BILLING_KAFKA_TLS_CERT_FILE=" + b.clientCert, "BILLING_KAFKA_TLS_KEY_FILE=" + b.client,
		}, "run")
		w.waitDrained(t, p, 2*time.Minute)
		report(t, w.verify(t, plan, first, 10))
	})

	t.Run("rejected at startup", func(t *testing.T) {
		w := newWorldOn(t, []string{b.plaintext}, pgtest.NewDatabase(t), 1, paysim.Faults{})
		wrong := "wrong-" + b.passwords["scram-sha-256"]
		otherCA := writeSecret(t, selfSignedPEM(t))
		tests := []struct {
			name string
			env  []string
			want []string
		}{
			{"wrong SCRAM password", b.saslEnv("scram-sha-256", wrong),
				[]string{"SASL authentication failed", "SCRAM-SHA-256", b.users["scram-sha-256"], "BILLING_KAFKA_SASL_PASSWORD"}},
			{"wrong PLAIN password", b.saslEnv("plain", wrong),
				[]string{"SASL authentication failed", "PLAIN", "BILLING_KAFKA_SASL_PASSWORD"}},
			{"SCRAM-SHA-512 for a SCRAM-SHA-256 user", append(b.saslEnv("scram-sha-256", b.passwords["scram-sha-256"]),
				"BILLING_KAFKA_SASL_MECHANISM=scram-sha-512"), []string{"SASL authentication failed", "SCRAM-SHA-512"}},
			{"broker not signed by the CA", append(b.saslEnv("scram-sha-256", b.passwords["scram-sha-256"]),
				"BILLING_KAFKA_TLS_CA_FILE="+otherCA), []string{"TLS handshake failed", "BILLING_KAFKA_TLS_CA_FILE"}},
			{"no client certificate", []string{"BILLING_KAFKA_BROKERS=" + b.mtls, "BILLING_KAFKA_TLS=true",
				"BILLING_KAFKA_TLS_CA_FILE=" + b.caFile}, []string{"TLS handshake failed"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var out logtest.Buffer
				start := time.Now()
				p, err := harness.Start(w.bin, []string{"run"}, w.env(tt.env...), &out)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(p.Kill)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				if err := p.Wait(ctx); err == nil || ctx.Err() != nil {
					t.Fatalf("run: %v after %s, want a prompt non-zero exit\n%s", err, time.Since(start), out.String())
				}
				last := lastLine(out.String())
				for _, s := range tt.want {
					if !strings.Contains(last, s) {
						t.Errorf("last line lacks %q: %s", s, last)
					}
				}
				if !strings.HasPrefix(last, "billing-consumer: ") {
					t.Errorf("last line is not the error line: %s", last)
				}
				for _, s := range append(values(b.passwords), wrong) {
					if strings.Contains(out.String(), s) {
						t.Errorf("output reveals a password:\n%s", out.String())
					}
				}
				t.Logf("exit after %s: %s", time.Since(start).Round(time.Millisecond), last)
			})
		}
	})

	t.Run("secrets never leak", func(t *testing.T) { testSecretsNeverLeak(t, b) })
}

// testSecretsNeverLeak runs the service with known secret values — a
// database password in the URL, a provider token, a SASL password — through
// startup errors (database unreachable, URL unparsable, broker unreachable,
// wrong SASL password), a provider answering 401 to a wrong token, and a
// workload that dead-letters (invalid records, declines), and fails if any
// secret appears in stdout or stderr, in a DLQ record (value or header), in
// /metrics or in /readyz.
func testSecretsNeverLeak(t *testing.T, b *secureBroker) {
	dbPassword := "dbpw" + randomHex(t)
	token := "tok" + randomHex(t)
	wrongToken := "tokwrong" + randomHex(t)
	wrongSASL := "saslwrong" + randomHex(t)
	saslPassword := b.passwords["scram-sha-512"]
	secrets := []string{dbPassword, token, wrongToken, wrongSASL, saslPassword}

	dbURL := withPassword(t, pgtest.NewDatabase(t), dbPassword)
	w := newWorldOn(t, []string{b.plaintext}, dbURL, 2, paysim.Faults{})
	// A provider that requires the token.
	w.sim = paysim.New(paysim.Config{Token: token, Seed: 5})
	srv := httptest.NewServer(w.sim)
	t.Cleanup(srv.Close)
	w.simURL = srv.URL
	first := time.Now().UnixMilli()*10 + 3
	plan := mustPlan(t, harness.Spec{Orders: 20, FirstOrderID: first, Invalid: 3, Declined: 2, Seed: 6, Now: time.Now()})
	w.sim.SetFaults(paysim.Faults{Decline: func(order int64) bool { return plan.Declined[order] }})
	if err := harness.Produce(context.Background(), w.brokers, w.topic, plan.Records); err != nil {
		t.Fatal(err)
	}

	var seen logtest.Buffer // everything the service wrote or served
	secure := append(b.saslEnv("scram-sha-512", saslPassword), "BILLING_PAYMENT_TOKEN="+token)
	exitsWith := func(name string, args []string, env ...string) {
		t.Helper()
		var out logtest.Buffer
		p, err := harness.Start(w.bin, args, w.env(append(append([]string{}, secure...), env...)...), &out)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		if err := p.Wait(ctx); err == nil || ctx.Err() != nil {
			t.Errorf("%s: %v, want a non-zero exit\n%s", name, err, out.String())
		}
		fmt.Fprintf(&seen, "== %s\n%s", name, out.String())
	}
	// Startup errors, each with every secret configured.
	exitsWith("migrate, database unreachable", []string{"migrate"}, "BILLING_DATABASE_URL=postgres://billing:"+dbPassword+"@127.0.0.1:1/x")
	exitsWith("migrate, URL unparsable", []string{"migrate"}, "BILLING_DATABASE_URL=postgres://billing:"+dbPassword+"@127.0.0.1:port/x")
	exitsWith("run, wrong SASL password", []string{"run"}, "BILLING_KAFKA_SASL_PASSWORD="+wrongSASL)
	exitsWith("dlq replay, broker unreachable", []string{"dlq", "replay"}, "BILLING_KAFKA_BROKERS="+kafkatest.FreePort(t))

	// run with the broker or the database unreachable: it keeps trying,
	// unready, saying why, until stopped.
	waitsUnready := func(name, why string, env ...string) {
		t.Helper()
		var out logtest.Buffer
		addr := kafkatest.FreePort(t)
		p, err := harness.Start(w.bin, []string{"run"}, w.env(append(append(append([]string{}, secure...), env...),
			"BILLING_HTTP_ADDR="+addr)...), &out)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		var ready string
		pollOps(t, 60*time.Second, name+": /readyz to say "+why, func() string {
			if _, ready = opsGet(t, "http://"+addr+"/readyz"); !strings.Contains(ready, why) {
				return ready
			}
			return ""
		})
		_, metrics := opsGet(t, "http://"+addr+"/metrics")
		_ = p.Stop(30 * time.Second)
		fmt.Fprintf(&seen, "== %s\n%s\n/readyz: %s\n/metrics:\n%s", name, out.String(), ready, metrics)
	}
	waitsUnready("run, broker unreachable", "waiting for Kafka", "BILLING_KAFKA_BROKERS="+kafkatest.FreePort(t))
	waitsUnready("run, database unreachable", "waiting for the database",
		"BILLING_DATABASE_URL=postgres://billing:"+dbPassword+"@127.0.0.1:1/x")

	// A wrong provider token: 401, a systemic pause, nothing dead-lettered.
	func() {
		var out logtest.Buffer
		addr := kafkatest.FreePort(t)
		p, err := harness.Start(w.bin, []string{"run"}, w.env(append(append([]string{}, secure...),
			"BILLING_PAYMENT_TOKEN="+wrongToken, "BILLING_HTTP_ADDR="+addr)...), &out)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		pollOps(t, 60*time.Second, "401 answers from the provider", func() string {
			if n := w.sim.Requests()[401]; n < 3 {
				return fmt.Sprintf("%d so far", n)
			}
			return ""
		})
		_, ready := opsGet(t, "http://"+addr+"/readyz")
		_, metrics := opsGet(t, "http://"+addr+"/metrics")
		if !strings.Contains(metrics, `billing_payment_requests_total{code="401"}`) {
			t.Errorf("/metrics does not count the 401 answers")
		}
		_ = p.Stop(30 * time.Second)
		fmt.Fprintf(&seen, "== run, wrong provider token\n%s\n/readyz: %s\n/metrics:\n%s", out.String(), ready, metrics)
	}()

	// The right token: the workload drains, with DLQ writes.
	addr := kafkatest.FreePort(t)
	var out logtest.Buffer
	p, err := harness.Start(w.bin, []string{"run"}, w.env(append(append([]string{}, secure...),
		"BILLING_HTTP_ADDR="+addr, "BILLING_LOG_LEVEL=debug")...), &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	w.waitDrained(t, p, 2*time.Minute)
	// The wrong-token run may have been stopped while a retry's request was
	// in flight: its claim stays pending (the outcome is unknown), and a
	// declined order's redelivery cannot release it. The completer settles
	// it, as in production.
	w.waitSettled(t, p)
	report(t, w.verify(t, plan, first, 20))
	var metrics string
	pollOps(t, 30*time.Second, "the lag gauge, from the lag client over SASL_SSL", func() string {
		_, metrics = opsGet(t, "http://"+addr+"/metrics")
		if !regexp.MustCompile(`billing_kafka_consumer_lag\{group="[^"]+",partition="1",topic="` + w.topic + `"\} 0\n`).MatchString(metrics) {
			return "no zero lag for partition 1 yet"
		}
		return ""
	})
	_, ready := opsGet(t, "http://"+addr+"/readyz")
	if err := p.Stop(30 * time.Second); err != nil {
		t.Errorf("stop: %v", err)
	}
	fmt.Fprintf(&seen, "== run\n%s\n/readyz: %s\n/metrics:\n%s", out.String(), ready, metrics)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := harness.ReadAll(ctx, w.brokers, w.dlqTopic)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) < 5 {
		t.Errorf("%d DLQ records, want the 3 invalid and 2 declined", len(recs))
	}
	for _, r := range recs {
		fmt.Fprintf(&seen, "== DLQ record\n%s\n", r.Value)
		for k, v := range r.Headers {
			fmt.Fprintf(&seen, "%s: %s\n", k, v)
		}
	}

	all := seen.String()
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("a secret appears: ...%s...", all[max(0, i-200):min(len(all), i+len(s)+50)])
		}
	}
	t.Logf("checked %d bytes of output, /metrics, /readyz and %d DLQ records for %d secrets", len(all), len(recs), len(secrets))
}

// withPassword returns dbURL with its password replaced, after checking
// that the server accepts it (scripts/pg.sh runs with trust authentication,
// so the password is the test's to choose).
func withPassword(t *testing.T, dbURL, password string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("the test database refuses a URL with another password (it needs trust authentication, as scripts/pg.sh sets up): %v", err)
	}
	_ = conn.Close(ctx)
	return u.String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func values(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func writeSecret(t *testing.T, content string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// selfSignedPEM is a CA certificate that signed nothing the broker has.
func selfSignedPEM(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", "/dev/null", "-subj", "/CN=another CA", "-days", "1").Output()
	if err != nil {
		t.Fatalf("openssl: %v", err)
	}
	return string(out)
}
