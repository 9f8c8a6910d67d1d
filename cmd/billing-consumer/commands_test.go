package main

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// commandPaths reads the binary's own command table, the Usage section of
// billing-consumer help: each "billing-consumer a b ..." line gives the
// words of a command path ("dlq replay"); "[run]" is run, and "x|y|z"
// gives one path each. A command added to help is tested at once.
func commandPaths(t *testing.T) [][]string {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	usage, _, ok := strings.Cut(out.String(), "\n\n"+"Every command")
	if !ok {
		t.Fatalf("help has no end of its Usage section:\n%s", out.String())
	}
	word := regexp.MustCompile(`^\[?[a-z][a-z|-]*\]?$`)
	var paths [][]string
	for _, line := range strings.Split(usage, "\n") {
		rest, ok := strings.CutPrefix(line, "  billing-consumer ")
		if !ok {
			continue
		}
		alts := [][]string{nil}
		for _, w := range strings.Split(rest, " ") {
			if !word.MatchString(w) || strings.HasPrefix(w, "[-") {
				break
			}
			var next [][]string
			for _, a := range strings.Split(strings.Trim(w, "[]"), "|") {
				for _, p := range alts {
					next = append(next, append(slices.Clone(p), a))
				}
			}
			alts = next
		}
		paths = append(paths, alts...)
	}
	if len(paths) < 8 {
		t.Fatalf("found %d commands in help's Usage section, want at least 8; the pattern no longer matches:\n%s", len(paths), usage)
	}
	return paths
}

// -h and --help on every command and subcommand print its usage on
// stdout and exit 0, however broken the configuration (they used to exit 1
// with "flag: help requested", print usage then an error, or call --help
// an unknown subcommand).
func TestEveryCommandHelp(t *testing.T) {
	paths := append(commandPaths(t), []string{"dlq"})
	for _, path := range paths {
		for _, h := range []string{"-h", "--help"} {
			args := append(slices.Clone(path), h)
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				setEnv(t, map[string]string{"BILLING_CONCURRENCY": "many", "BILLING_KAFKA_BROKER": "typo"})
				var stdout, stderr bytes.Buffer
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := run(ctx, args, &stdout, &stderr); err != nil {
					t.Fatalf("exit 1: %v", err)
				}
				if path[0] != "help" && !strings.HasPrefix(stdout.String(), "Usage: billing-consumer "+strings.Join(path, " ")) &&
					!(path[0] == "dlq" && strings.HasPrefix(stdout.String(), "Usage: billing-consumer dlq ")) {
					t.Errorf("stdout does not start with its usage:\n%s", stdout.String())
				}
				if stderr.Len() != 0 {
					t.Errorf("stderr: %s", stderr.String())
				}
			})
		}
	}
}

// With every dependency unreachable, each command fails at once (main
// prints its error on one line) with nothing on stdout that reads like a result (a table ending
// "total 0", a header, "0 claims handled"), and no log line promises
// retries a one-shot command will not make; run, stopped (SIGTERM) while it
// waits for them, exits 0. reconcile --dry-run needs no provider.
func TestEveryCommandWithDependenciesDown(t *testing.T) {
	down := map[string]string{
		"BILLING_KAFKA_BROKERS": kafkatest.FreePort(t),
		"BILLING_DATABASE_URL":  "postgres://u:pw@" + kafkatest.FreePort(t) + "/x",
		"BILLING_PAYMENT_URL":   "http://" + kafkatest.FreePort(t),
		"BILLING_HTTP_ADDR":     kafkatest.FreePort(t),
	}
	var cases [][]string
	for _, p := range commandPaths(t) {
		cases = append(cases, p)
		if p[len(p)-1] == "replay" || p[len(p)-1] == "reconcile" {
			cases = append(cases, append(slices.Clone(p), "--dry-run"))
		}
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			env := down
			if slices.Equal(args, []string{"reconcile", "--dry-run"}) {
				env = map[string]string{"BILLING_DATABASE_URL": down["BILLING_DATABASE_URL"]}
			}
			setEnv(t, env)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var stdout, stderr bytes.Buffer
			if args[0] == "run" {
				// SIGTERM at several moments of the start: at once, while
				// it builds, while it waits for Kafka.
				for _, after := range []time.Duration{0, 20 * time.Millisecond, 300 * time.Millisecond, 1500 * time.Millisecond} {
					stopCtx, stop := context.WithCancel(ctx)
					time.AfterFunc(after, stop)
					if err := run(stopCtx, args, &stdout, &stderr); err != nil {
						t.Errorf("SIGTERM %s into the start: %v, want a clean stop", after, err)
					}
					stop()
				}
			} else {
				err := run(ctx, args, &stdout, &stderr)
				switch {
				case args[0] == "help" || args[0] == "version":
					if err != nil || stdout.Len() == 0 {
						t.Errorf("%v, stdout %q", err, stdout.String())
					}
					return
				case err == nil:
					t.Fatalf("succeeded with every dependency down; stdout:\n%s", stdout.String())
				case strings.Contains(err.Error(), "BILLING_PAYMENT_URL"):
					t.Errorf("asks for the provider: %v", err)
				}
				t.Logf("error: %v", err)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout before or without a result:\n%s", stdout.String())
			}
			if s := stderr.String(); strings.Contains(s, "keep retrying") || (args[0] != "run" && strings.Contains(s, "retrying")) {
				t.Errorf("a log line promises retries:\n%s", s)
			}
		})
	}
}
