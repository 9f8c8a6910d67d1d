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

	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
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
// stdout, JSON logs to stderr. Every command and subcommand answers -h and
// --help with its usage on stdout and a nil error (exit 0); a command that
// fails prints no result on stdout, only its error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // the usage is printed
	}
	return err
}

// dispatch runs one command; flag.ErrHelp means it printed its usage.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	command := "run"
	if len(args) > 0 {
		command, args = args[0], args[1:]
	}
	switch command {
	case "run":
		return serve(ctx, args, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if err := noFlags("help", args, stdout); err != nil {
			return err
		}
		return help(stdout)
	case "version", "--version":
		if err := noFlags("version", args, stdout); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "billing-consumer %s (commit %s, %s)\n", version, commit, runtime.Version())
		return nil
	case "migrate":
		return migrateCommand(ctx, args, stdout, stderr)
	case "retention":
		return withDB(ctx, args, "retention", stdout, stderr, func(ctx context.Context, cfg config, db *postgres.DB, logger *slog.Logger) error {
			if err := schemaCurrent(ctx, db); err != nil {
				return err
			}
			_, err := maintainer(cfg, db, logger).RunOnce(ctx)
			return err
		})
	case "dlq":
		return dlqCommand(ctx, args, stdout, stderr)
	case "reconcile":
		return reconcileCommand(ctx, args, stdout, stderr)
	case "claim":
		return claimCommand(ctx, args, stdout, stderr)
	case "pause", "resume":
		return pauseCommand(ctx, command, args, stdout, stderr)
	case "positions":
		return positionsCommand(ctx, args, stdout, stderr)
	}
	return fmt.Errorf("unknown command %q: %w", command, errUsage)
}

// noFlags rejects arguments for commands that take none; -h or --help
// prints the command's usage on stdout and returns flag.ErrHelp.
func noFlags(name string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "Usage: billing-consumer %s\n\n%s\n", name, plainUsage[name])
		return err
	} else if err != nil {
		return fmt.Errorf("%s: %w (%w)", name, err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (%w)", name, fs.Arg(0), errUsage)
	}
	return nil
}

// plainUsage says what each command without flags does, for its -h.
var plainUsage = map[string]string{
	"run": "Consume until SIGTERM/SIGINT, then shut down gracefully (also the command when none is given).\n" +
		"Needs BILLING_KAFKA_BROKERS, BILLING_DATABASE_URL and BILLING_PAYMENT_URL; billing-consumer help lists every variable.",
	"migrate": "Apply the embedded database migrations and create the dedup partitions, then exit.\n" +
		"Safe to run concurrently and repeatedly. Needs BILLING_DATABASE_URL.",
	"retention": "One pass of dedup partition maintenance (create ahead, drop expired), then exit.\n" +
		"Needs BILLING_DATABASE_URL and a migrated database.",
	"help":    "Print the commands and every BILLING_* variable with its type, default and meaning.",
	"version": "Print the version, commit and Go version.",
}

// withDB runs a one-shot command that needs only the database.
func withDB(ctx context.Context, args []string, name string, stdout, stderr io.Writer,
	fn func(context.Context, config, *postgres.DB, *slog.Logger) error) error {
	if err := noFlags(name, args, stdout); err != nil {
		return err
	}
	return onDB(ctx, stderr, fn)
}

// onDB reads the configuration of a command that needs only the database,
// opens the pool and runs fn with it (claim, pause, resume, and withDB's).
func onDB(ctx context.Context, stderr io.Writer, fn func(context.Context, config, *postgres.DB, *slog.Logger) error) error {
	cfg, err := configFor(need{})
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	db, err := connectDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(ctx, cfg, db, logger)
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	level, _ := cfg.logLevel() // validated
	// Lines logged inside a span (the pipeline's, per event) carry its
	// trace_id and span_id.
	return slog.New(tracing.LogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})))
}

// openDB opens the pool of BILLING_DATABASE_URL without connecting (run
// waits for the database itself, see startup; postgres.Open), with opts
// (run's failover heal, postgres.WithHeal) and the pool's size. Its errors
// never include the URL, which may hold a password.
func openDB(ctx context.Context, cfg config, opts ...postgres.Option) (*postgres.DB, error) {
	db, err := postgres.Open(ctx, cfg.DatabaseURL, append(opts, postgres.WithMaxConns(cfg.dbMaxConns()))...)
	return db, urlError(err)
}

// connectDB is openDB, then one ping, for the one-shot commands: they fail
// at once when the database is unreachable (postgres.Connect).
func connectDB(ctx context.Context, cfg config) (*postgres.DB, error) {
	db, err := postgres.Connect(ctx, cfg.DatabaseURL, postgres.WithMaxConns(cfg.dbMaxConns()))
	return db, urlError(err)
}

// urlError names the variable in postgres.ErrInvalidURL.
func urlError(err error) error {
	if errors.Is(err, postgres.ErrInvalidURL) {
		return fmt.Errorf("BILLING_DATABASE_URL: %w", err)
	}
	return err
}

// schemaCurrent fails, saying to run billing-consumer migrate, while the
// database's schema is behind the migrations this binary embeds: the
// one-shot commands would otherwise fail on a missing table or column.
func schemaCurrent(ctx context.Context, db *postgres.DB) error {
	cur, latest, err := postgres.SchemaVersions(ctx, db)
	if err != nil {
		return err
	}
	if cur < latest {
		return fmt.Errorf("database schema version %d, this build needs %d: run billing-consumer migrate", cur, latest)
	}
	return nil
}

func maintainer(cfg config, db *postgres.DB, logger *slog.Logger) *dedup.Maintainer {
	return postgres.NewMaintainer(db, dedup.Maintainer{
		Retention: cfg.DedupRetention, Ahead: cfg.DedupPartitionsAhead,
		LockTimeout: cfg.DedupLockTimeout, Now: time.Now, Logger: logger,
	})
}

func help(w io.Writer) error {
	fmt.Fprint(w, `billing-consumer charges each confirmed order exactly once, from Kafka.

Usage:
  billing-consumer [run]                          consume until SIGTERM/SIGINT, then shut down gracefully
  billing-consumer migrate [--allow-breaking]     apply the embedded database migrations, create the dedup partitions, exit;
                                                  refuses a migration that breaks older replicas still running
                                                  unless --allow-breaking
  billing-consumer retention                      one pass of dedup partition maintenance and exit
  billing-consumer dlq replay [--reason R] [--order ID] [--partition P --offset O] [--max N] [--dry-run]
                                                  republish the selected dead-lettered records to the source
                                                  topic: by default the exhausted ones (R: invalid, permanent,
                                                  conflict or exhausted); only those republished are marked
                                                  replayed. Print a summary and exit; -h for details
  billing-consumer dlq list [--reason R] [--since D|T] [--order ID] [--json]
                                                  one line per dead-lettered record (where, why, which order,
                                                  whether replay has republished it), read with the service's
                                                  Kafka TLS/SASL settings; changes nothing
  billing-consumer dlq inspect [--reason R] [--since D|T] [--order ID] [--json]
                                                  the same records in full: headers, key and value
  billing-consumer reconcile [--older-than D] [--dry-run]
                                                  settle the pending ledger claims older than D (default
                                                  BILLING_COMPLETER_AFTER) by re-sending their stored request
                                                  (same key, same body), list them and the blocked ones, and exit
  billing-consumer claim show|release|mark-charged --order ID [--reason TEXT] [--charge-id ID]
                                                  an operator's decision on one ledger claim: release a blocked
                                                  one (--provider-holds-no-charge) or mark one charged; each change
                                                  written to the claim_audit table; -h for details
  billing-consumer pause --reason TEXT            every replica of the consumer group stops fetching and sending
                                                  (stays in the group, finishes the requests in flight) until
                                                  resume; reconcile refuses meanwhile; kept in Postgres
  billing-consumer resume                         end the pause
  billing-consumer positions show [--partition P] per partition: the group's committed offset in Kafka, the
                                                  database's position (how far it holds the decisions), the gap
  billing-consumer positions accept --reason TEXT [--partition P]
                                                  after a deliberate forward offset reset: move the database's
                                                  positions forward to the committed offsets; audited in
                                                  position_audit; -h for details
  billing-consumer help                           this text
  billing-consumer version                        version, commit and Go version

Every command and subcommand prints its usage with -h or --help.

Environment. The secrets may instead be read from a mounted file named by
  BILLING_DATABASE_URL_FILE, BILLING_PAYMENT_TOKEN_FILE or
  BILLING_KAFKA_SASL_PASSWORD_FILE (one of each pair, not both). A BILLING_*
  variable not in this table stops the start, naming the nearest known one,
  except those Kubernetes injects for a Service named billing-consumer
  (BILLING_CONSUMER_SERVICE_HOST, BILLING_CONSUMER_PORT_9090_TCP, ...):

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
