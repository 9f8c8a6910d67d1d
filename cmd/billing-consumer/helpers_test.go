package main

import (
	"bufio"
	"context"
	"encoding/json"
	"github.com/billing-consumer/billing-consumer/internal/testkit/logtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// These tests change the process environment with t.Setenv (run reads it
// through envconfig), so none of them may run in parallel.

// unset, as a value in an env map, removes the variable.
const unset = "\x00unset"

// cleanEnv removes every BILLING_* variable (the BILLING_TEST_* ones that
// locate test servers excepted) for the duration of the test, and the
// unprefixed names of the config fields too (DATABASE_URL, LOG_LEVEL, ...),
// which envconfig falls back to.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, envPrefix+"_") && !strings.HasPrefix(k, envPrefix+"_TEST_") {
			unsetenv(t, k)
		}
	}
	ct := reflect.TypeFor[config]()
	for i := range ct.NumField() {
		if alt := ct.Field(i).Tag.Get("envconfig"); alt != "" {
			if _, ok := os.LookupEnv(alt); ok {
				unsetenv(t, alt)
			}
		}
	}
}

func unsetenv(t *testing.T, k string) {
	t.Helper()
	t.Setenv(k, "") // restores the old value when the test ends
	if err := os.Unsetenv(k); err != nil {
		t.Fatal(err)
	}
}

// runTimings are the group and shutdown timings of the tests that start
// `run` against a real broker: short enough for a rebalance or a stop to
// take seconds, with the drain below the session and rebalance timeouts as
// consumer.New requires.
var runTimings = map[string]string{
	"BILLING_KAFKA_SESSION_TIMEOUT":   "6s",
	"BILLING_KAFKA_REBALANCE_TIMEOUT": "10s",
	"BILLING_DRAIN_TIMEOUT":           "2s",
	"BILLING_SHUTDOWN_TIMEOUT":        "20s",
}

// setEnv starts from a clean environment and sets the maps' variables, later
// maps overriding earlier ones; the value unset removes a variable.
func setEnv(t *testing.T, envs ...map[string]string) {
	t.Helper()
	cleanEnv(t)
	merged := map[string]string{}
	for _, env := range envs {
		for k, v := range env {
			merged[k] = v
		}
	}
	for k, v := range merged {
		if v == unset {
			unsetenv(t, k)
			continue
		}
		t.Setenv(k, v)
	}
}

// validEnv is the least a `run` needs; nothing listens at these addresses.
var validEnv = map[string]string{
	"BILLING_KAFKA_BROKERS": "127.0.0.1:9092",
	"BILLING_DATABASE_URL":  "postgres://u:pw@127.0.0.1:1/x",
	"BILLING_PAYMENT_URL":   "http://127.0.0.1:1",
}

// writeFile writes content to a fresh file and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// logLines parses JSON log output, one object per line, failing the test
// on a line that is not JSON.
func logLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		lines = append(lines, m)
	}
	return lines
}

// logsWithMsg returns the log lines whose msg is msg.
func logsWithMsg(lines []map[string]any, msg string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["msg"] == msg {
			out = append(out, l)
		}
	}
	return out
}

// inProcess is `billing-consumer run` running in the test's own process,
// with the environment the test has set.
type inProcess struct {
	ctx            context.Context // ends when the service is stopped
	stdout, stderr *logtest.Buffer
	cancel         context.CancelFunc
	done           chan error
	err            error
	ended          bool
}

// startRun starts `run`; it is stopped, if the test has not, at cleanup.
func startRun(t *testing.T) *inProcess {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProcess{ctx: ctx, stdout: &logtest.Buffer{}, stderr: &logtest.Buffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- run(ctx, []string{"run"}, p.stdout, p.stderr) }()
	t.Cleanup(func() {
		cancel()
		p.wait()
	})
	return p
}

func (p *inProcess) wait() error {
	if !p.ended {
		p.err, p.ended = <-p.done, true
	}
	return p.err
}

// httpAddr waits for the "billing-consumer started" log line and returns
// its http_addr; it fails the test if run returns first.
func (p *inProcess) httpAddr(t *testing.T) string {
	t.Helper()
	var addr string
	poll.Until(t, 30*time.Second, "the started log line", func() bool {
		select {
		case err := <-p.done:
			p.err, p.ended = err, true
			t.Fatalf("run returned early: %v\n%s", err, p.stderr.String())
		default:
		}
		for _, l := range logsWithMsg(logLines(t, p.stderr.String()), "billing-consumer started") {
			addr, _ = l["http_addr"].(string)
		}
		return addr != ""
	})
	return addr
}

// stop cancels run and returns its result, failing the test if it does
// not return within 40 s.
func (p *inProcess) stop(t *testing.T) error {
	t.Helper()
	p.cancel()
	if p.ended {
		return p.err
	}
	select {
	case err := <-p.done:
		p.err, p.ended = err, true
		return err
	case <-time.After(40 * time.Second):
		t.Fatal("run did not stop after its context ended")
		return nil
	}
}
