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
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, dlqUsage)
		return flag.ErrHelp
	case "replay":
		return dlqReplay(ctx, args[1:], stdout, stderr)
	case "list", "inspect":
		return dlqBrowse(ctx, args[0], args[1:], stdout, stderr)
	}
	return fmt.Errorf("dlq: unknown subcommand %q (%w)", args[0], errUsage)
}

// dlqUsage is the usage of `billing-consumer dlq`.
const dlqUsage = `Usage: billing-consumer dlq replay|list|inspect [flags]

  replay   republish the selected dead-lettered records (by default the exhausted ones) to the source topic
  list     one line per dead-lettered record: where, why, which order, whether replay has republished it
  inspect  the same records in full: headers, key and value

Each reads BILLING_KAFKA_* (the service's own TLS/SASL settings) and needs no database;
billing-consumer dlq <subcommand> -h lists its flags.
`

// dlqReplay is `billing-consumer dlq replay [--reason R] [--order ID]
// [--partition P --offset O] [--max N] [--dry-run]`: republish the selected
// dead-lettered records (by default the exhausted ones) to the source topic
// (see internal/replay's Replayer) and print a summary on stdout. A run
// that stopped early (a refused record, an interruption, a Kafka error)
// prints no table: its one error line says what it had replayed. It needs
// Kafka only, not the database or the provider.
func dlqReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := replayFlags(args, stdout)
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
	if err != nil {
		done := "republished"
		if opts.DryRun {
			done = "would have republished"
		}
		return fmt.Errorf("dlq replay stopped (it %s %d record(s) before): %w", done, sum.Total.Replayed, err)
	}
	printReplaySummary(stdout, cfg, opts, sum)
	return nil
}

// replayUsage is the synopsis of dlq replay.
const replayUsage = "Usage: billing-consumer dlq replay [--reason R] [--order ID] [--partition P --offset O] [--max N] [--dry-run]"

// replayFlags parses the flags of dlq replay. -h prints them on stdout and
// returns flag.ErrHelp. Errors are one line and wrap errUsage.
func replayFlags(args []string, stdout io.Writer) (replay.Options, error) {
	var opts replay.Options
	fs := flag.NewFlagSet("dlq replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&opts.Max, "max", 0, "republish at most `N` records in this run (default: no limit)")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "read and report what would be replayed; republish and commit nothing")
	reason := fs.String("reason", "exhausted", "replay only records of this dlq-reason (`R`: invalid, permanent, conflict or exhausted); the others stay as they are, not replayed")
	fs.Int64Var(&opts.Order, "order", 0, "replay only the records of this order `ID`")
	partition := fs.Int("partition", 0, "with --offset: replay only the record at this dead-letter partition `P` (see dlq list)")
	offset := fs.Int64("offset", 0, "with --partition: the offset `O` of that record")
	bad := func(format string, a ...any) error {
		return fmt.Errorf("dlq replay: %s (%w)", fmt.Sprintf(format, a...), errUsage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, replayUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return opts, err
		}
		return opts, bad("%v", err)
	}
	if fs.NArg() > 0 {
		return opts, bad("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["max"] && opts.Max < 1 {
		return opts, bad("--max must be at least 1, got %d", opts.Max)
	}
	r, err := dlq.ParseReason(*reason)
	if err != nil {
		return opts, bad("--reason: %v", err)
	}
	opts.Reason = r
	if set["order"] && opts.Order < 1 {
		return opts, bad("--order must be a positive order id, got %d", opts.Order)
	}
	switch {
	case set["partition"] != set["offset"]:
		return opts, bad("--partition and --offset go together (a record of dlq list), got only one")
	case set["partition"] && (*partition < 0 || *offset < 0):
		return opts, bad("--partition and --offset must not be negative")
	case set["partition"]:
		opts.At = &replay.RecordAt{Partition: *partition, Offset: *offset}
	}
	return opts, nil
}

// printReplaySummary writes one line per reason and the totals.
func printReplaySummary(w io.Writer, cfg config, opts replay.Options, sum replay.Summary) {
	fmt.Fprintf(w, "dlq replay of %s to %s (group %s), selected: reason %s", cfg.KafkaDLQTopic, cfg.KafkaTopic, cfg.dlqReplayGroup(), opts.Reason)
	if opts.Order > 0 {
		fmt.Fprintf(w, ", order %d", opts.Order)
	}
	if opts.At != nil {
		fmt.Fprintf(w, ", record %d@%d", opts.At.Partition, opts.At.Offset)
	}
	if opts.DryRun {
		fmt.Fprint(w, ", dry run: nothing was republished or committed; REPLAYED counts what would be")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REASON\tREPLAYED\tNOT_SELECTED\tREFUSED")
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
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", name, c.Replayed, c.NotSelected, c.Refused)
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\n", sum.Total.Replayed, sum.Total.NotSelected, sum.Total.Refused)
	_ = tw.Flush()
	if sum.MaxReached {
		fmt.Fprintf(w, "stopped after --max %d; run again to go on\n", opts.Max)
	}
	if sum.Total.NotSelected > 0 {
		fmt.Fprintln(w, "records NOT_SELECTED are left as they were: not replayed, still in billing_dlq_records")
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
	if err := checkKafka(ctx, kconns, cfg); err != nil {
		return cfg, nil, nil, err
	}
	return cfg, kconns, logger, nil
}
