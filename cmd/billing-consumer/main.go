// Command billing-consumer charges customers exactly once for the
// order.confirmed events of a Kafka topic. `billing-consumer help` lists its
// commands and every BILLING_* variable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/dedup"
	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// Set by the linker: -X main.version=... -X main.commit=...
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		// One line, whatever the error: pgx joins per-host errors with
		// newlines.
		fmt.Fprintln(os.Stderr, "billing-consumer:", strings.Join(strings.Fields(err.Error()), " "))
		os.Exit(1)
	}
}

// errUsage marks a wrong command line; run has printed the usage hint.
var errUsage = errors.New("see billing-consumer help")

// run executes the command in args (without the program name) until it
// finishes or ctx is cancelled (SIGTERM, SIGINT). Settings come from the
// BILLING_* environment, read by envconfig. Output for people goes to
// stdout, JSON logs to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	command := "run"
	if len(args) > 0 {
		command, args = args[0], args[1:]
	}
	switch command {
	case "run":
		return serve(ctx, args, stderr)
	case "help", "-h", "-help", "--help":
		if err := noFlags("help", args); err != nil {
			return err
		}
		return help(stdout)
	case "version", "--version":
		if err := noFlags("version", args); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "billing-consumer %s (commit %s, %s)\n", version, commit, runtime.Version())
		return nil
	case "migrate":
		return migrateCommand(ctx, args, stderr)
	case "retention":
		return withDB(ctx, args, "retention", stderr, func(ctx context.Context, cfg config, pool *pgxpool.Pool, logger *slog.Logger) error {
			_, err := maintainer(cfg, pool, logger).RunOnce(ctx)
			return err
		})
	case "dlq":
		return dlqCommand(ctx, args, stdout, stderr)
	case "reconcile":
		return reconcileCommand(ctx, args, stdout, stderr)
	}
	return fmt.Errorf("unknown command %q: %w", command, errUsage)
}

// noFlags rejects arguments for commands that take none.
func noFlags(name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w (%w)", name, err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (%w)", name, fs.Arg(0), errUsage)
	}
	return nil
}

// withDB runs a one-shot command that needs only the database.
func withDB(ctx context.Context, args []string, name string, stderr io.Writer,
	fn func(context.Context, config, *pgxpool.Pool, *slog.Logger) error) error {
	if err := noFlags(name, args); err != nil {
		return err
	}
	cfg, err := configFor(need{})
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(ctx, cfg, pool, logger)
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	level, _ := cfg.logLevel() // validated
	// Lines logged inside a span (the pipeline's, per event) carry its
	// trace_id and span_id.
	return slog.New(tracing.LogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})))
}

// newPool makes the pool of BILLING_DATABASE_URL without connecting: run
// waits for the database itself (see startup), while it serves /healthz.
// Its errors never include the URL, which may hold a password.
func newPool(ctx context.Context, cfg config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("BILLING_DATABASE_URL: not a valid connection string")
	}
	pc.MaxConns = cfg.dbMaxConns()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return pool, nil
}

// openPool is newPool, then one ping, for the one-shot commands: they
// fail at once when the database is unreachable. pgx's connect errors name
// only host, user and database.
func openPool(ctx context.Context, cfg config) (*pgxpool.Pool, error) {
	pool, err := newPool(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		cc := pool.Config().ConnConfig
		return nil, fmt.Errorf("connect to database %s:%d/%s: %w", cc.Host, cc.Port, cc.Database, err)
	}
	return pool, nil
}

func maintainer(cfg config, pool *pgxpool.Pool, logger *slog.Logger) *dedup.Maintainer {
	return &dedup.Maintainer{
		Pool: pool, Retention: cfg.DedupRetention, Ahead: cfg.DedupPartitionsAhead,
		LockTimeout: cfg.DedupLockTimeout, Now: time.Now, Logger: logger,
	}
}

func help(w io.Writer) error {
	fmt.Fprint(w, `billing-consumer charges each confirmed order exactly once, from Kafka.

Usage:
  billing-consumer [run]                          consume until SIGTERM/SIGINT, then shut down gracefully
  billing-consumer migrate [--allow-breaking]     apply the embedded database migrations, create the dedup partitions, exit;
                                                  refuses a migration that breaks older replicas still running
                                                  unless --allow-breaking
  billing-consumer retention                      one pass of dedup partition maintenance and exit
  billing-consumer dlq replay [--max N] [--dry-run] [--reason R]
                                                  republish dead-lettered records (R: invalid, permanent, conflict
                                                  or exhausted) to the source topic from where the last replay
                                                  stopped, print a summary and exit; -h for details
  billing-consumer dlq list [--reason R] [--since D|T] [--order ID] [--json]
                                                  one line per dead-lettered record (where, why, which order,
                                                  whether replay has passed it), read with the service's
                                                  Kafka TLS/SASL settings; changes nothing
  billing-consumer dlq inspect [--reason R] [--since D|T] [--order ID] [--json]
                                                  the same records in full: headers, key and value
  billing-consumer reconcile [--older-than D] [--dry-run]
                                                  settle the pending ledger claims older than D (default
                                                  BILLING_COMPLETER_AFTER) by re-sending their stored request
                                                  (same key, same body), list them and the blocked ones, and exit
  billing-consumer help                           this text
  billing-consumer version                        version, commit and Go version

Environment. The secrets may instead be read from a mounted file named by
  BILLING_DATABASE_URL_FILE, BILLING_PAYMENT_TOKEN_FILE or
  BILLING_KAFKA_SASL_PASSWORD_FILE (one of each pair, not both):

`)
	if err := printUsage(w); err != nil {
		return err
	}
	_, err := fmt.Fprint(w, `
Tracing: spans are exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set; the other standard OTEL_* variables
(OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_HEADERS, OTEL_SDK_DISABLED, ...) apply.
An incoming traceparent header is propagated to the payment call either way.
`)
	return err
}
