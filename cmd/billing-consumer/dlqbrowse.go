package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
)

// dlqBrowse is `billing-consumer dlq list|inspect [--reason R] [--since
// D|T] [--order ID] [--json]`: read the dead-letter topic (earliest
// retained record to its current end) with the service's own Kafka TLS and
// SASL settings, and print the records the filters select: list one line
// each, inspect each in full (headers, key, value). Nothing is changed or
// committed. The distroless image has no Kafka CLI: this is the runbook's
// way to look at dead letters.
func dlqBrowse(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	filter, asJSON, err := browseFlags(name, args, stdout, time.Now())
	if err != nil {
		return err
	}
	cfg, kconns, _, err := kafkaCommand(ctx, stderr)
	if err != nil {
		return err
	}
	client := &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: kconns.Transport, Timeout: 30 * time.Second}
	bc := dlq.BrowseConfig{Brokers: cfg.KafkaBrokers, Topic: cfg.KafkaDLQTopic, ReplayGroup: cfg.dlqReplayGroup(),
		Dialer: kconns.Dialer, Client: client}
	// The records are written to stdout only once all are read: a failure
	// half-way (Kafka gone) must not leave a table that looks complete.
	var out bytes.Buffer
	tw := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
	if name == "list" && !asJSON {
		fmt.Fprintln(tw, "PARTITION\tOFFSET\tFAILED_AT\tREASON\tORDER\tATTEMPTS\tREPLAYED\tORIGINAL\tERROR")
	}
	n := 0
	err = dlq.Browse(ctx, bc, filter, func(e dlq.Entry) error {
		n++
		switch {
		case asJSON:
			return json.NewEncoder(&out).Encode(entryJSON(e, name == "inspect"))
		case name == "list":
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%d\t%t\t%s/%d@%d\t%s\n", e.Partition, e.Offset,
				e.FailedAt.UTC().Format(time.RFC3339), e.Reason, e.OrderID, e.Attempts, e.Replayed,
				e.OriginalTopic, e.OriginalPartition, e.OriginalOffset, oneLine(e.Error, 120))
		default:
			printEntry(&out, e)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("dlq %s of %s: %w", name, cfg.KafkaDLQTopic, err)
	}
	_ = tw.Flush()
	if _, err := out.WriteTo(stdout); err != nil {
		return err
	}
	if !asJSON {
		fmt.Fprintf(stderr, "%d dead-letter record(s) of %s selected\n", n, cfg.KafkaDLQTopic)
	}
	return nil
}

// browseFlags parses the flags of dlq list and inspect. --since takes a
// duration back from now (24h) or an RFC 3339 time.
func browseFlags(name string, args []string, stdout io.Writer, now time.Time) (dlq.Filter, bool, error) {
	var f dlq.Filter
	fs := flag.NewFlagSet("dlq "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	reason := fs.String("reason", "", "only records of this dlq-reason (`R`: invalid, permanent, conflict or exhausted)")
	since := fs.String("since", "", "only records dead-lettered since `D` ago (e.g. 24h) or since an RFC 3339 time")
	order := fs.Int64("order", 0, "only records of this order `ID` (the value's order_id, else the record key)")
	asJSON := fs.Bool("json", false, "one JSON object per record and line"+map[bool]string{true: ", with key, value and headers", false: ""}[name == "inspect"])
	bad := func(format string, a ...any) error {
		return fmt.Errorf("dlq %s: %s (%w)", name, fmt.Sprintf(format, a...), errUsage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: billing-consumer dlq %s [--reason R] [--since D|T] [--order ID] [--json]\n", name)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return f, false, err
		}
		return f, false, bad("%v", err)
	}
	if fs.NArg() > 0 {
		return f, false, bad("unexpected argument %q", fs.Arg(0))
	}
	if *reason != "" {
		r, err := dlq.ParseReason(*reason)
		if err != nil {
			return f, false, bad("--reason: %v", err)
		}
		f.Reason = r
	}
	if *since != "" {
		if d, err := time.ParseDuration(*since); err == nil && d > 0 {
			f.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339, *since); err == nil {
			f.Since = t
		} else {
			return f, false, bad("--since %q: want a positive duration (24h) or an RFC 3339 time", *since)
		}
	}
	if *order < 0 {
		return f, false, bad("--order must be a positive order id, got %d", *order)
	}
	f.OrderID = *order
	return f, *asJSON, nil
}

// entryView is an entry as JSON; key, value and headers only with full.
type entryView struct {
	Partition         int               `json:"partition"`
	Offset            int64             `json:"offset"`
	FailedAt          time.Time         `json:"failed_at"`
	Reason            string            `json:"reason"`
	Error             string            `json:"error"`
	Attempts          int               `json:"attempts"`
	OrderID           int64             `json:"order_id,omitempty"`
	Replayed          bool              `json:"replayed"`
	ReplayCount       int               `json:"replay_count"`
	OriginalTopic     string            `json:"original_topic"`
	OriginalPartition int               `json:"original_partition"`
	OriginalOffset    int64             `json:"original_offset"`
	ConsumerGroup     string            `json:"consumer_group"`
	Key               *string           `json:"key,omitempty"`
	Value             *string           `json:"value,omitempty"`
	Headers           map[string]string `json:"headers,omitempty"`
}

func entryJSON(e dlq.Entry, full bool) entryView {
	v := entryView{Partition: e.Partition, Offset: e.Offset, FailedAt: e.FailedAt.UTC(), Reason: string(e.Reason),
		Error: e.Error, Attempts: e.Attempts, OrderID: e.OrderID, Replayed: e.Replayed, ReplayCount: e.ReplayCount,
		OriginalTopic: e.OriginalTopic, OriginalPartition: e.OriginalPartition, OriginalOffset: e.OriginalOffset,
		ConsumerGroup: e.ConsumerGroup}
	if full {
		k, val := printable(e.Key), printable(e.Value)
		v.Key, v.Value = &k, &val
		v.Headers = map[string]string{}
		for _, h := range e.Headers {
			v.Headers[h.Key] = printable(h.Value)
		}
	}
	return v
}

// printEntry writes one record in full, for inspect.
func printEntry(w io.Writer, e dlq.Entry) {
	fmt.Fprintf(w, "record %d@%d: %s, order %d, dead-lettered %s after %d attempt(s), replayed %t\n",
		e.Partition, e.Offset, e.Reason, e.OrderID, e.FailedAt.UTC().Format(time.RFC3339), e.Attempts, e.Replayed)
	for _, h := range e.Headers {
		fmt.Fprintf(w, "  header %s: %s\n", h.Key, printable(h.Value))
	}
	fmt.Fprintf(w, "  key: %s\n  value: %s\n\n", printable(e.Key), printable(e.Value))
}

// printable is b as text when it is UTF-8, else as a quoted Go string:
// a binary value cannot break the terminal.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strconv.Quote(string(b))
}

// oneLine shortens s to n bytes on one line, for the list's last column.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
