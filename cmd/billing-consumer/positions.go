package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// positionsUsage is the usage of `billing-consumer positions` after its
// first line.
const positionsUsage = `
  billing-consumer positions show [--partition P]
  billing-consumer positions accept --reason TEXT [--partition P] [--operator NAME] [--dry-run]

The database's positions say, per partition of BILLING_KAFKA_TOPIC, how far the
database holds the decisions of the consumer group (BILLING_KAFKA_GROUP_ID): each
replica writes them just before it commits offsets to Kafka (table
consumer_position). A group whose committed offset is ahead of the database's
position either lost database commits (a failover onto a standby that was behind)
or was moved forward on purpose.

show prints, per partition, Kafka's committed offset, the database's position
and the gap between them; it changes nothing.

accept is for after a deliberate forward reset of the group's offsets
(kafka-consumer-groups --reset-offsets --to-latest, ...): it moves the database's
positions forward to the group's committed offsets (never back), so that the
records skipped on purpose are not taken for lost commits. Each move is written
to the table position_audit with the operator, host and reason, in the same
transaction, and logged. Do not run it to silence a gap you cannot explain: that
gap may be a database that lost its last commits (docs/operations.md, "Positions").
With --dry-run, accept prints the positions it would move and changes nothing.

Needs BILLING_DATABASE_URL and BILLING_KAFKA_* (the service's own TLS/SASL settings).

Flags:
`

// positionsFlags declares the flags of the positions subcommands.
func positionsFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("partition", -1, "only partition `P` (default: every partition of the topic)")
	fs.String("reason", "", "accept only: why the offsets were moved: an incident or ticket reference (required)")
	fs.String("operator", "", "accept only: who decides, for the audit trail (default: the OS user)")
	fs.Bool("dry-run", false, "accept only: print the positions accept would move, and change nothing")
	return fs
}

// positionsCommand is `billing-consumer positions show|accept`.
func positionsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("positions: missing subcommand (show or accept) (%w)", errUsage)
	}
	sub := args[0]
	if sub == "-h" || sub == "--help" || sub == "-help" {
		fmt.Fprint(stdout, "Usage: billing-consumer positions show|accept [flags]\n"+positionsUsage)
		fs := positionsFlags("positions")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	}
	if sub != "show" && sub != "accept" {
		return fmt.Errorf("positions: unknown subcommand %q (want show or accept) (%w)", sub, errUsage)
	}
	fs := positionsFlags("positions " + sub)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, "Usage: billing-consumer positions "+sub+" [flags]\n"+positionsUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("positions %s: %w (%w)", sub, err, errUsage)
	}
	req, err := positionsRequest(fs, sub)
	if err != nil {
		return err
	}
	cfg, err := configFor(need{kafka: true})
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	kconns, err := kafkaConns(cfg, nil)
	if err != nil {
		return err
	}
	if err := checkKafka(ctx, kconns, cfg); err != nil {
		return err
	}
	db, err := connectDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	g := groupPositions{
		client:    &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: kconns.Transport, Timeout: 15 * time.Second},
		positions: &postgres.Positions{DB: db}, group: cfg.KafkaGroupID, topic: cfg.KafkaTopic,
	}
	return g.run(ctx, logger, stdout, sub, req)
}

// positionsReq is a positions command line, checked.
type positionsReq struct {
	partition int // -1: every partition
	dryRun    bool
	audit     postgres.Audit
}

func positionsRequest(fs *flag.FlagSet, sub string) (positionsReq, error) {
	get := func(name string) string { return strings.TrimSpace(fs.Lookup(name).Value.String()) }
	fail := func(format string, a ...any) (positionsReq, error) {
		return positionsReq{}, fmt.Errorf("positions %s: %s (%w)", sub, fmt.Sprintf(format, a...), errUsage)
	}
	req := positionsReq{partition: fs.Lookup("partition").Value.(flag.Getter).Get().(int),
		dryRun: get("dry-run") == "true", audit: postgres.Audit{Reason: get("reason"), Operator: get("operator")}}
	switch {
	case fs.NArg() > 0:
		return fail("unexpected argument %q", fs.Arg(0))
	case req.partition < -1:
		return fail("--partition must be a partition number (0 or more)")
	case sub == "show" && (req.audit.Reason != "" || req.audit.Operator != "" || req.dryRun):
		return fail("--reason, --operator and --dry-run are for accept only")
	case sub == "accept" && req.audit.Reason == "":
		return fail("--reason is required")
	}
	if sub == "accept" {
		if req.audit.Operator == "" {
			req.audit.Operator = osUser()
		}
		req.audit.Host, _ = os.Hostname()
	}
	return req, nil
}

// groupPositions reads a group's committed offsets in Kafka and its
// positions in the database.
type groupPositions struct {
	client       *kafka.Client
	positions    *postgres.Positions
	group, topic string
}

// partitionView is one partition as show prints it: committed -1 when the
// group has committed nothing, position -1 when it is not tracked.
type partitionView struct {
	id                  int
	committed, position int64
	writtenAt           time.Time
	// marked: the commit carries the consumer's mark, so a position behind
	// it is a loss (the heal's), never a reset to accept.
	marked bool
}

// read returns the view of the partitions of the topic (only want, unless
// it is -1). Kafka is read first, the database second: a position written
// between the two reads can only make the gap look smaller.
func (g groupPositions) read(ctx context.Context, want int) ([]partitionView, error) {
	ids, err := kafkagroup.Partitions(ctx, g.client, g.topic)
	if err != nil {
		return nil, err
	}
	if want >= 0 {
		if !slices.Contains(ids, want) {
			return nil, fmt.Errorf("topic %s has no partition %d", g.topic, want)
		}
		ids = []int{want}
	}
	slices.Sort(ids)
	committed, err := kafkagroup.CommittedMarks(ctx, g.client, g.group, g.topic, ids)
	if err != nil {
		return nil, err
	}
	pos, err := g.positions.List(ctx, g.group, g.topic)
	if err != nil {
		return nil, schemaHint(err)
	}
	out := make([]partitionView, 0, len(ids))
	for _, id := range ids {
		v := partitionView{id: id, committed: -1, position: -1}
		if c, ok := committed[id]; ok {
			v.committed, v.marked = c.Offset, c.Marked
		}
		if p, ok := pos[id]; ok {
			v.position, v.writtenAt = p.Next, p.WrittenAt
		}
		out = append(out, v)
	}
	return out, nil
}

// run shows the positions, or accepts the committed offsets first.
func (g groupPositions) run(ctx context.Context, logger *slog.Logger, stdout io.Writer, sub string, req positionsReq) error {
	views, err := g.read(ctx, req.partition)
	if err != nil {
		return err
	}
	if sub == "accept" && req.dryRun {
		printDryRun(stdout, g.group, views)
	} else if sub == "accept" {
		if err := postgres.RefuseDuringHeal(ctx, g.positions.DB, g.group); err != nil {
			return fmt.Errorf("positions accept: %w", err)
		}
		targets := map[int]int64{}
		for _, v := range views {
			if v.committed >= 0 && !v.marked {
				targets[v.id] = v.committed
			}
		}
		done, err := g.positions.Accept(ctx, g.group, g.topic, targets, req.audit)
		if err != nil {
			return schemaHint(err)
		}
		moved := 0
		for _, a := range done {
			if a.Moved {
				moved++
				logger.Info("positions accepted", "group", g.group, "topic", g.topic, "partition", a.Partition,
					"before", a.Before, "after", a.After, "operator", req.audit.Operator, "host", req.audit.Host, "reason", req.audit.Reason)
			}
		}
		fmt.Fprintf(stdout, "moved %d position(s) of consumer group %s forward to its committed offsets (audited in position_audit by %s)\n",
			moved, g.group, req.audit.Operator)
		if views, err = g.read(ctx, req.partition); err != nil {
			return err
		}
	}
	printPositions(stdout, g.group, g.topic, views)
	gate, err := postgres.NewHealStore(g.positions.DB, g.group, g.topic).Gate(ctx)
	if err != nil {
		return schemaHint(err)
	}
	printHeal(stdout, gate, views)
	old, err := g.positions.Untracked(ctx, g.group)
	if err != nil {
		return schemaHint(err)
	}
	if len(old) > 0 {
		fmt.Fprintf(stdout, "replicas of a release that writes no positions run in this group: %s;\n"+
			"their commits leave the database behind Kafka without any loss\n", strings.Join(old, ", "))
	}
	return nil
}

// printDryRun says which positions accept would move: those behind a
// committed offset.
func printDryRun(w io.Writer, group string, views []partitionView) {
	n := 0
	for _, v := range views {
		switch {
		case v.committed >= 0 && v.position < v.committed && v.marked:
			fmt.Fprintf(w, "dry run: partition %d is behind a commit of this release (marked): lost database commits, "+
				"which the failover heal re-decides; accept leaves it\n", v.id)
		case v.committed >= 0 && v.position < v.committed:
			fmt.Fprintf(w, "dry run: would move partition %d from %s to %d\n", v.id, offsetText(v.position), v.committed)
			n++
		}
	}
	fmt.Fprintf(w, "dry run: would move %d position(s) of consumer group %s; nothing changed\n", n, group)
}

// printPositions writes one line per partition: Kafka's committed offset,
// the database's position, the gap and what it means.
func printPositions(w io.Writer, group, topic string, views []partitionView) {
	fmt.Fprintf(w, "consumer group %s, topic %s:\n", group, topic)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tKAFKA COMMITTED\tDATABASE POSITION\tGAP\tWRITTEN AT\tSTATE")
	behind := 0
	for _, v := range views {
		gap, state := "-", "in step"
		switch {
		case v.position < 0:
			state = "untracked (no position written yet)"
		case v.committed < 0:
			state = "nothing committed in Kafka"
		case v.committed > v.position && v.marked:
			gap, state = fmt.Sprint(v.committed-v.position), "database behind a marked commit: lost database commits (the failover heal re-decides them)"
		case v.committed > v.position:
			gap, state = fmt.Sprint(v.committed-v.position), "database behind Kafka"
			behind++
		case v.position > v.committed:
			gap, state = "0", "database ahead of Kafka (the records between are redelivered: duplicates)"
		default:
			gap = "0"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", v.id, offsetText(v.committed), offsetText(v.position), gap, stamp(v.writtenAt), state)
	}
	_ = tw.Flush()
	if behind > 0 {
		fmt.Fprintf(w, "%d partition(s) where Kafka is ahead of the database by unmarked commits: a forward offset reset\n"+
			"(billing-consumer positions accept --reason TEXT puts the table in step) or commits by a release that writes no marks\n", behind)
	}
}

// printHeal writes the ranges of a failover heal that is up (nothing when
// none is): each partition's position against its target.
func printHeal(w io.Writer, gate map[int]heal.Range, views []partitionView) {
	if gate == nil {
		return
	}
	fmt.Fprintln(w, "failover heal in progress: billing is held on every replica until each position reaches its target")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tRE-DECIDE FROM\tTARGET\tDATABASE POSITION\tSTATE")
	pos := map[int]int64{}
	for _, v := range views {
		pos[v.id] = v.position
	}
	for _, id := range slices.Sorted(maps.Keys(gate)) {
		r, p := gate[id], int64(-1)
		if v, ok := pos[id]; ok {
			p = v
		} else if len(views) == 1 {
			continue // --partition: another partition
		}
		state := "re-deciding"
		if p >= r.Hi {
			state = "done"
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\n", id, r.Lo, r.Hi, offsetText(p), state)
	}
	_ = tw.Flush()
}

func offsetText(o int64) string {
	if o < 0 {
		return "-"
	}
	return fmt.Sprint(o)
}
