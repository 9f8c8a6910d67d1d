package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/kafkaconn"
	"github.com/billing-consumer/billing-consumer/internal/replay"
)

// dlqCommand is `billing-consumer dlq <subcommand>`: replay, list or
// inspect.
func dlqCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("dlq: missing subcommand (replay, list or inspect) (%w)", errUsage)
	}
	switch args[0] {
	case "replay":
		return dlqReplay(ctx, args[1:], stdout, stderr)
	case "list", "inspect":
		return dlqBrowse(ctx, args[0], args[1:], stdout, stderr)
	}
	return fmt.Errorf("dlq: unknown subcommand %q (%w)", args[0], errUsage)
}

// dlqReplay is `billing-consumer dlq replay [--max N] [--dry-run]
// [--reason R]`: republish dead-lettered records to the source topic (see
// internal/dlq's Replayer), print a summary on stdout, and exit non-zero if
// the run stopped early (a refused record, an interruption, a Kafka error).
// It needs Kafka only, not the database or the provider.
func dlqReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := replayFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg, kconns, logger, err := kafkaCommand(ctx, stderr)
	if err != nil {
		return err
	}
	r, err := replay.New(replay.Config{
		Brokers:     cfg.KafkaBrokers,
		DLQTopic:    cfg.KafkaDLQTopic,
		SourceTopic: cfg.KafkaTopic,
		GroupID:     cfg.dlqReplayGroup(),
		MaxReplays:  cfg.DLQMaxReplays,
		Dialer:      kconns.Dialer,
		Transport:   kconns.Transport,
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	sum, err := r.Run(ctx, opts)
	// The summary also after a stop: it says what was done before it.
	printReplaySummary(stdout, cfg, opts, sum)
	if err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	return nil
}

// replayFlags parses the flags of dlq replay. -h prints them on stdout and
// returns flag.ErrHelp. Errors are one line and wrap errUsage.
func replayFlags(args []string, stdout io.Writer) (replay.Options, error) {
	var opts replay.Options
	fs := flag.NewFlagSet("dlq replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&opts.Max, "max", 0, "republish at most `N` records in this run (default: no limit)")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "read and report what would be replayed; republish and commit nothing")
	reason := fs.String("reason", "", "replay only records of this dlq-reason (`R`: invalid, permanent, conflict or exhausted); skip the others for good")
	bad := func(format string, a ...any) error {
		return fmt.Errorf("dlq replay: %s (%w)", fmt.Sprintf(format, a...), errUsage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "Usage: billing-consumer dlq replay [--max N] [--dry-run] [--reason R]")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return opts, err
		}
		return opts, bad("%v", err)
	}
	if fs.NArg() > 0 {
		return opts, bad("unexpected argument %q", fs.Arg(0))
	}
	maxSet := false
	fs.Visit(func(f *flag.Flag) { maxSet = maxSet || f.Name == "max" })
	if maxSet && opts.Max < 1 {
		return opts, bad("--max must be at least 1, got %d", opts.Max)
	}
	if *reason != "" {
		r, err := dlq.ParseReason(*reason)
		if err != nil {
			return opts, bad("--reason: %v", err)
		}
		opts.Reason = r
	}
	return opts, nil
}

// printReplaySummary writes one line per reason and the totals.
func printReplaySummary(w io.Writer, cfg config, opts replay.Options, sum replay.Summary) {
	fmt.Fprintf(w, "dlq replay of %s to %s (group %s)", cfg.KafkaDLQTopic, cfg.KafkaTopic, cfg.dlqReplayGroup())
	if opts.DryRun {
		fmt.Fprint(w, ", dry run: nothing was republished or committed; REPLAYED counts what would be")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REASON\tREPLAYED\tSKIPPED\tREFUSED")
	reasons := []dlq.Reason{dlq.Invalid, dlq.Permanent, dlq.Conflict, dlq.Exhausted}
	for _, r := range slices.Sorted(maps.Keys(sum.ByReason)) {
		if !slices.Contains(reasons, r) {
			reasons = append(reasons, r) // unknown or missing dlq-reason
		}
	}
	for _, r := range reasons {
		c := sum.ByReason[r]
		name := string(r)
		if name == "" {
			name = "(none)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", name, c.Replayed, c.Skipped, c.Refused)
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\n", sum.Total.Replayed, sum.Total.Skipped, sum.Total.Refused)
	_ = tw.Flush()
	if sum.MaxReached {
		fmt.Fprintf(w, "stopped after --max %d; run again to go on\n", opts.Max)
	}
}

// dlqReplayGroup is BILLING_DLQ_REPLAY_GROUP_ID, by default the consumer
// group's name plus ".dlq-replay".
func (c config) dlqReplayGroup() string {
	if c.DLQReplayGroupID != "" {
		return c.DLQReplayGroupID
	}
	return c.KafkaGroupID + ".dlq-replay"
}

// kafkaCommand reads the configuration of a command that needs Kafka only
// (the dlq commands) and checks the brokers accept the service's TLS and
// SASL settings.
func kafkaCommand(ctx context.Context, stderr io.Writer) (config, *kafkaconn.Conns, *slog.Logger, error) {
	cfg, err := configFor(need{kafka: true, withoutDB: true})
	if err != nil {
		return cfg, nil, nil, err
	}
	kconns, err := kafkaConns(cfg, nil)
	if err != nil {
		return cfg, nil, nil, err
	}
	logger := newLogger(cfg, stderr)
	if err := checkKafka(ctx, kconns, cfg, logger); err != nil {
		return cfg, nil, nil, err
	}
	return cfg, kconns, logger, nil
}
