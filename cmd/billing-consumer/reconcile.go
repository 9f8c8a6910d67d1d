package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/payment"
)

// completer builds the ledger completer of the service and of reconcile.
func completer(cfg config, pool *pgxpool.Pool, charger billing.Charger, logger *slog.Logger) *billing.Completer {
	return &billing.Completer{
		Pool: pool, Charger: charger, After: cfg.CompleterAfter, BlockAfter: cfg.ClaimBlockAfter,
		DBTimeout: cfg.DBTimeout, Now: time.Now, Logger: logger,
	}
}

// reconcileCommand is `billing-consumer reconcile [--older-than D]
// [--dry-run]`: one completer pass, whatever the other replicas do (it
// waits for none: the advisory lock makes it skip when a running service
// is settling at that moment, and it says so), then a table of what it
// did and of the claims still unsettled.
func reconcileCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	olderThan := fs.Duration("older-than", 0, "settle the pending claims older than this (default BILLING_COMPLETER_AFTER)")
	dryRun := fs.Bool("dry-run", false, "list what would be re-sent; send nothing, change nothing")
	if err := fs.Parse(args); err != nil {
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
	payTLS, err := paymentTLS(cfg)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	payer, err := payment.New(payment.Config{
		BaseURL: cfg.PaymentURL, Token: cfg.PaymentToken, Timeout: cfg.PaymentTimeout,
		Proxy: http.ProxyFromEnvironment, TLS: payTLS,
	})
	if err != nil {
		return err
	}
	defer payer.CloseIdleConnections()
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := completer(cfg, pool, payer.ForBilling(), logger).RunOnce(ctx, billing.PassOptions{OlderThan: *olderThan, DryRun: *dryRun, ListBlocked: true})
	printReconcile(stdout, rep)
	return err
}

// printReconcile writes what a pass did for an operator.
func printReconcile(w io.Writer, rep billing.PassReport) {
	if rep.Skipped {
		fmt.Fprintln(w, "another process is settling claims right now (the completer's lock is held); nothing was re-sent")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tEVENT\tAMOUNT\tCLAIMED AT\tRESULT\tDETAIL")
	for _, s := range append(rep.Settled, rep.Blocked...) {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", s.OrderID, s.EventID, s.Amount, s.ClaimedAt.UTC().Format(time.RFC3339), s.Result, s.Detail)
	}
	_ = tw.Flush()
	u := rep.Unsettled
	fmt.Fprintf(w, "%d claims handled; now %d pending (oldest %s), %d blocked\n",
		len(rep.Settled), u.Pending, u.OldestPending.Round(time.Second), u.Blocked)
	if u.Blocked > 0 {
		fmt.Fprintln(w, "blocked claims need an operator: see BillingLedgerClaimBlocked in docs/operations.md")
	}
}
