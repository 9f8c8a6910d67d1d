package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/pause"
)

// completer builds the ledger completer of the service and of reconcile;
// its sends are recorded under sender, from host; paused is its check of
// an operator's pause (billing.Completer.Paused).
func completer(cfg config, db *postgres.DB, charger billing.Charger, logger *slog.Logger, sender, host string, paused func() bool) *billing.Completer {
	return &billing.Completer{
		Sessions: postgres.NewSessions(db), Charger: charger, After: cfg.CompleterAfter, BlockAfter: cfg.ClaimBlockAfter,
		DBTimeout: cfg.DBTimeout, Now: time.Now, Logger: logger, Sends: cfg.sends(host), Sender: sender, Paused: paused,
	}
}

// reconcileCommand is `billing-consumer reconcile [--older-than D]
// [--dry-run]`: one completer pass, whatever the other replicas do (it
// waits for none: the advisory lock makes it skip when a running service
// is settling at that moment, and it says so), then a table of what it
// did and of the claims still unsettled. While billing is paused it sends
// nothing (reconcilePause) and fails, naming billing-consumer resume. A dry run reads the ledger only:
// it needs no provider (BILLING_PAYMENT_URL) and sends nothing. A failed
// pass prints no table, only its error.
func reconcileCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	olderThan := fs.Duration("older-than", 0, "settle the pending claims older than `D` (default BILLING_COMPLETER_AFTER)")
	dryRun := fs.Bool("dry-run", false, "list what would be re-sent; send nothing, change nothing (needs no BILLING_PAYMENT_URL)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, "Usage: billing-consumer reconcile [--older-than D] [--dry-run]")
		fmt.Fprintln(stdout, "\nSettle the pending ledger claims by re-sending their stored request (same key, same body), list them and the blocked ones, and exit.")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return err
	} else if err != nil {
		return fmt.Errorf("reconcile: %w (%w)", err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("reconcile: unexpected argument %q (%w)", fs.Arg(0), errUsage)
	}
	if *olderThan < 0 {
		return fmt.Errorf("reconcile: --older-than must not be negative (%w)", errUsage)
	}
	cfg, err := configFor(need{payment: !*dryRun})
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	charger, closeCharger, err := reconcileCharger(cfg, *dryRun)
	if err != nil {
		return err
	}
	defer closeCharger()
	db, err := connectDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := schemaCurrent(ctx, db); err != nil {
		return err
	}
	if !*dryRun {
		if err := postgres.RefuseDuringHeal(ctx, db, cfg.KafkaGroupID); err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
	}
	paused := &reconcilePause{ctx: ctx, db: db, group: cfg.KafkaGroupID, timeout: cfg.DBTimeout}
	rep, err := completer(cfg, db, charger, logger, billing.SenderReconcile, hostname(), paused.paused).RunOnce(ctx, billing.PassOptions{OlderThan: *olderThan, DryRun: *dryRun, ListBlocked: true})
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	printReconcile(stdout, rep, *dryRun)
	if rep.Paused {
		return fmt.Errorf("reconcile: %s: stopped before its next request, nothing re-sent after it; end the pause with billing-consumer resume, then run reconcile again",
			paused.why())
	}
	return nil
}

// reconcilePause is reconcile's check of an operator's pause (SPEC §11
// I4): it has no pause.Watcher, so before each claim and each request it
// reads the group's billing_pause row itself. A pause set while reconcile
// runs stops it before its next request, as it stops the service's
// completer; a read that fails counts as paused: reconcile sends only
// while it knows that billing is not paused. A dry run sends nothing and
// never asks.
type reconcilePause struct {
	ctx     context.Context
	db      *postgres.DB
	group   string
	timeout time.Duration
	state   pause.State // the last read
	err     error       // the last read's failure
}

func (p *reconcilePause) paused() bool {
	ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
	defer cancel()
	p.state, p.err = postgres.PauseOf(ctx, p.db, p.group)
	if p.err == nil {
		// A failover heal that began since reconcile started holds it as
		// a pause does (the service's own completer skips its passes).
		p.err = postgres.RefuseDuringHeal(ctx, p.db, p.group)
	}
	return p.err != nil || p.state.Paused
}

// why says what stopped reconcile: the pause, or the failed read of it.
func (p *reconcilePause) why() string {
	if errors.Is(p.err, postgres.ErrHealing) {
		return p.err.Error()
	}
	if p.err != nil {
		return fmt.Sprintf("cannot tell whether billing is paused (%v)", p.err)
	}
	return fmt.Sprintf("billing is paused for consumer group %s since %s by %s: %s", p.group,
		p.state.Since.UTC().Format(time.RFC3339), p.state.Operator, p.state.Reason)
}

// reconcileCharger is the provider's client, or for a dry run a charger
// that refuses to be called: a dry run never sends.
func reconcileCharger(cfg config, dryRun bool) (billing.Charger, func(), error) {
	if dryRun {
		return noCharger{}, func() {}, nil
	}
	payTLS, err := paymentTLS(cfg)
	if err != nil {
		return nil, nil, err
	}
	payer, err := payment.New(payment.Config{
		Engine:  payment.Engine(cfg.PaymentClient),
		BaseURL: cfg.PaymentURL, Token: cfg.PaymentToken, Timeout: cfg.PaymentTimeout,
		Proxy: http.ProxyFromEnvironment, TLS: payTLS,
	})
	if err != nil {
		return nil, nil, err
	}
	return payer.ForBilling(), payer.CloseIdleConnections, nil
}

// noCharger is the charger of a dry run.
type noCharger struct{}

func (noCharger) Charge(context.Context, billing.ChargeRequest) (billing.ChargeResult, error) {
	return billing.ChargeResult{}, errors.New("reconcile --dry-run sends nothing")
}

// printReconcile writes what a pass did for an operator, counting each
// result by name: a dry run says what it would do, and that it did
// nothing.
func printReconcile(w io.Writer, rep billing.PassReport, dryRun bool) {
	if rep.Skipped {
		fmt.Fprintln(w, "another process is settling claims right now (the completer's lock is held); nothing was re-sent")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tEVENT\tAMOUNT\tCLAIMED AT\tRESULT\tDETAIL")
	for _, s := range append(rep.Settled, rep.Blocked...) {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", s.OrderID, s.EventID, s.Amount, s.ClaimedAt.UTC().Format(time.RFC3339), s.Result, s.Detail)
	}
	_ = tw.Flush()
	byResult := map[string]int{}
	for _, s := range rep.Settled {
		byResult[s.Result]++
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(byResult)) {
		parts = append(parts, fmt.Sprintf("%d %s", byResult[r], r))
	}
	did := "stale pending claims: none"
	if len(parts) > 0 {
		did = "stale pending claims: " + strings.Join(parts, ", ")
	}
	if dryRun {
		did = "dry run, nothing sent or changed; " + did
	}
	u := rep.Unsettled
	fmt.Fprintf(w, "%s; now %d pending (oldest %s, %d parked), %d blocked; %d deferred events waiting on a claim\n",
		did, u.Pending, u.OldestPending.Round(time.Second), u.Parked, u.Blocked, u.Deferred)
	if u.Blocked > 0 {
		fmt.Fprintln(w, "blocked claims need an operator: see BillingLedgerClaimBlocked in docs/operations.md")
	}
	if u.StrayBeside > 0 {
		fmt.Fprintf(w, "%d order(s) charged under a second key beside their charged claim (stray charges): claim show --order ID lists both; see BillingLedgerClaimBlocked in docs/operations.md\n", u.StrayBeside)
	}
}
