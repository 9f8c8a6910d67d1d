package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// claimSynopsis is each claim subcommand's usage line.
var claimSynopsis = map[string]string{
	"show":         "billing-consumer claim show --order ID",
	"release":      "billing-consumer claim release --order ID --reason TEXT --provider-holds-no-charge [--operator NAME]",
	"mark-charged": "billing-consumer claim mark-charged --order ID --reason TEXT --charge-id ID [--operator NAME]",
}

// claimUsage is the usage of `billing-consumer claim` after its first
// line: the one command's synopsis, or "claim show|release|mark-charged".
const claimUsage = `
  billing-consumer claim show --order ID
  billing-consumer claim release --order ID --reason TEXT --provider-holds-no-charge [--operator NAME]
  billing-consumer claim mark-charged --order ID --reason TEXT --charge-id ID [--operator NAME]

An operator's decision on one charge ledger claim (see BillingLedgerClaimBlocked
in docs/operations.md). Only safe moves exist: release deletes a blocked claim
(so that a redelivery or replay of the order's event may charge it) and only
when you state that the provider holds no charge for the claim's idempotency
key (its event id) and no stray charge is recorded for the order (the provider
holds money for it: mark it charged instead); mark-charged records the provider's charge id on a pending
or blocked claim. Each change is written, with the row before and after, to the
claim_audit table in the same transaction, and logged; show prints the claim
(its status column and its state: parked is a pending row with parked_at), that trail, the recorded sends, the events deferred behind the order and any
stray charges (2xx answers for a key whose claim was gone). The operator is --operator, else the OS user of the process
(in a pod, the image's user: pass --operator there).

Flags:
`

// claimCommand is `billing-consumer claim show|release|mark-charged`. It
// needs only the database.
func claimCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		if len(args) == 0 {
			return fmt.Errorf("claim: missing subcommand (show, release or mark-charged) (%w)", errUsage)
		}
		fmt.Fprint(stdout, "Usage: billing-consumer claim show|release|mark-charged [flags]\n"+claimUsage)
		fs := claimFlags("claim")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	}
	sub := args[0]
	var action billing.OperatorAction
	switch sub {
	case "show":
	case "release":
		action = billing.ActionRelease
	case "mark-charged":
		action = billing.ActionMarkCharged
	default:
		return fmt.Errorf("claim: unknown subcommand %q (want show, release or mark-charged) (%w)", sub, errUsage)
	}
	fs := claimFlags("claim " + sub)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, "Usage: "+claimSynopsis[sub]+"\n"+claimUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("claim %s: %w (%w)", sub, err, errUsage)
	}
	req, err := claimRequest(fs, sub, action)
	if err != nil {
		return err
	}
	return onDB(ctx, stderr, func(ctx context.Context, cfg config, db *postgres.DB, logger *slog.Logger) error {
		if sub != "show" {
			if err := postgres.RefuseDuringHeal(ctx, db, cfg.KafkaGroupID); err != nil {
				return fmt.Errorf("claim %s: %w", sub, err)
			}
		}
		return claimOn(ctx, db, logger, stdout, sub, action, req)
	})
}

// claimOn carries out req on the ledger and prints the claim with its
// audit trail, its sends, the events deferred behind it and the order's
// stray charges.
func claimOn(ctx context.Context, pg *postgres.DB, logger *slog.Logger, stdout io.Writer, sub string, action billing.OperatorAction, req billing.OperatorRequest) error {
	db := postgres.NewStore(pg)
	if sub != "show" {
		before, err := billing.ApplyOperator(ctx, db, logger, req)
		if err != nil {
			return schemaHint(err)
		}
		fmt.Fprintf(stdout, "order %d: claim %s (event %s) %s by %s\n", req.OrderID, before.Status, before.EventID,
			map[billing.OperatorAction]string{billing.ActionRelease: "released", billing.ActionMarkCharged: "marked charged"}[action], req.Operator)
	}
	cl, trail, err := billing.ShowClaim(ctx, db, req.OrderID)
	if err != nil && !errors.Is(err, billing.ErrNoClaim) {
		return schemaHint(err)
	}
	sends, err := billing.ClaimSends(ctx, db, req.OrderID, cl)
	if err != nil {
		return schemaHint(err)
	}
	deferred, err := billing.DeferredOn(ctx, db, req.OrderID)
	if err != nil {
		return schemaHint(err)
	}
	strays, err := billing.StrayCharges(ctx, db, req.OrderID)
	if err != nil {
		return schemaHint(err)
	}
	printClaim(stdout, req.OrderID, cl, trail)
	printSends(stdout, sends)
	printDeferred(stdout, deferred)
	printStrays(stdout, strays)
	if cl == nil && sub == "show" {
		return fmt.Errorf("claim show: order %d: %w", req.OrderID, billing.ErrNoClaim)
	}
	return nil
}

// claimFlags declares the flags of the claim subcommands on a set that
// parses silently (errors are returned, -h is printed by the caller).
func claimFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int64("order", 0, "the order `ID` of the claim (required)")
	fs.String("reason", "", "why: an incident or ticket reference and what the provider said (required by release and mark-charged)")
	fs.String("charge-id", "", "the provider's charge `ID` for this claim's idempotency key (required by mark-charged)")
	fs.Bool("provider-holds-no-charge", false, "release only: you checked that the provider holds no charge for this claim's idempotency key")
	fs.String("operator", "", "who decides, for the audit trail (default: the OS user)")
	return fs
}

// claimRequest checks the flags of sub and builds its request.
func claimRequest(fs *flag.FlagSet, sub string, action billing.OperatorAction) (billing.OperatorRequest, error) {
	get := func(name string) string { return fs.Lookup(name).Value.String() }
	fail := func(format string, a ...any) (billing.OperatorRequest, error) {
		return billing.OperatorRequest{}, fmt.Errorf("claim %s: %s (%w)", sub, fmt.Sprintf(format, a...), errUsage)
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	req := billing.OperatorRequest{Action: action, Reason: strings.TrimSpace(get("reason")), ChargeID: strings.TrimSpace(get("charge-id")),
		ProviderHoldsNoCharge: get("provider-holds-no-charge") == "true", Operator: strings.TrimSpace(get("operator"))}
	req.OrderID = fs.Lookup("order").Value.(flag.Getter).Get().(int64)
	switch {
	case req.OrderID <= 0:
		return fail("--order must be a positive order id")
	case sub == "show":
		return req, nil
	case req.Reason == "":
		return fail("--reason is required")
	case sub == "release" && !req.ProviderHoldsNoCharge:
		return fail("--provider-holds-no-charge is required: release only a claim the provider holds no charge for")
	case sub == "release" && req.ChargeID != "":
		return fail("--charge-id contradicts a release: a claim the provider charged is marked charged")
	case sub == "mark-charged" && req.ChargeID == "":
		return fail("--charge-id is required: the provider's charge id for this claim")
	case sub == "mark-charged" && req.ProviderHoldsNoCharge:
		return fail("--provider-holds-no-charge contradicts mark-charged")
	}
	if req.Operator == "" {
		req.Operator = osUser()
	}
	req.Host, _ = os.Hostname()
	return req, nil
}

// osUser is the name of the user running the process, or uid:N when it
// has none in the passwd database.
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return fmt.Sprintf("uid:%d", os.Getuid())
}

// schemaHint adds "run billing-consumer migrate" to an error caused by a
// table the database does not have yet.
func schemaHint(err error) error {
	if postgres.UndefinedTable(err) {
		return fmt.Errorf("%w: the database schema is behind this binary; run billing-consumer migrate", err)
	}
	return err
}

// stamp formats a time of the ledger, "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// printSends writes every recorded send of the order's claims and who
// made it (SPEC §11 I5).
func printSends(w io.Writer, sends []billing.Send) {
	if len(sends) == 0 {
		fmt.Fprintln(w, "sends: none recorded")
		return
	}
	fmt.Fprintln(w, "sends:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  SENT AT\tIN FLIGHT UNTIL\tEVENT\tSENDER\tHOST")
	for _, s := range sends {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", stamp(s.SentAt), stamp(s.InFlightUntil), s.EventID, s.SenderLabel(), s.Host)
	}
	_ = tw.Flush()
}

// printDeferred writes the events deferred behind the order: they are
// decided with the claim, once it is settled or an operator decided it.
func printDeferred(w io.Writer, ds []billing.DeferredBehind) {
	if len(ds) == 0 {
		fmt.Fprintln(w, "deferred: none waiting on the order")
		return
	}
	fmt.Fprintln(w, "deferred: (decided in this order once the claim settles)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  EVENT\tWAITS FOR\tDEFERRED AT\tATTEMPTS\tGROUP\tLAST ERROR")
	for _, d := range ds {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\n", d.EventID, d.WaitsFor, stamp(d.DeferredAt), d.Attempts, d.Group, d.LastError)
	}
	_ = tw.Flush()
}

// printStrays writes the stray charges of the order (SPEC §11, the 2xx
// rule): charges the provider took under an event whose claim was gone or
// another event's. Each is money taken beside the claim shown above.
func printStrays(w io.Writer, strays []billing.StrayCharge) {
	if len(strays) == 0 {
		fmt.Fprintln(w, "stray charges: none")
		return
	}
	fmt.Fprintln(w, "stray charges: (the provider charged these keys beside the claim: look each up before deciding)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  AT\tEVENT (KEY)\tPROVIDER CHARGE ID\tSENDER\tCLAIM THEN")
	for _, s := range strays {
		then := "none"
		if s.ClaimState != billing.ClaimReleased {
			then = fmt.Sprintf("%s, event %s", s.ClaimState, s.ClaimEventID)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", stamp(s.At), s.EventID, s.ProviderChargeID, s.Sender, then)
	}
	_ = tw.Flush()
}

// printClaim writes the claim (or that there is none) and its audit trail.
func printClaim(w io.Writer, order int64, cl *billing.OperatorClaim, trail []billing.AuditEntry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if cl == nil {
		fmt.Fprintf(tw, "order\t%d\nclaim\tnone (no ledger row)\n", order)
	} else {
		// status is the column; state the claim's lifecycle state
		// (billing.ClaimState: parked is a pending row with parked_at).
		fmt.Fprintf(tw, "order\t%d\nstatus\t%s\nstate\t%s\n", cl.OrderID, cl.Status, cl.State)
		fmt.Fprintf(tw, "event (idempotency key)\t%s\ncustomer\t%d\namount\t%s\n", cl.EventID, cl.CustomerID, cl.Amount)
		fmt.Fprintf(tw, "claimed at\t%s\nprovider charge id\t%s\n", cl.ClaimedAt.UTC().Format(time.RFC3339), cl.ProviderChargeID)
		if cl.Status == "charged" {
			fmt.Fprintf(tw, "charged at\t%s\n", cl.ChargedAt.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(tw, "settle attempts\t%d\nlast error\t%s\n", cl.SettleAttempts, cl.LastError)
		fmt.Fprintf(tw, "in flight until\t%s\ndecisions allowed from\t%s\n", stamp(cl.InFlightUntil), stamp(cl.DecideAfter))
	}
	_ = tw.Flush()
	if len(trail) == 0 {
		fmt.Fprintln(w, "audit: no operator decision recorded")
		return
	}
	fmt.Fprintln(w, "audit:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  AT\tACTION\tOPERATOR\tHOST\tREASON")
	for _, a := range trail {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", a.At.UTC().Format(time.RFC3339), a.Action, a.Operator, a.Host, a.Reason)
	}
	_ = tw.Flush()
}
