// Package loop is the one shape of the service's background loops (the
// ledger completer, the deferred decisions, dedup retention, the schema
// guard, the pause watch, the lag, group and dead-letter watchers): a Loop
// is a name, whether it bills, an interval and one pass, RunOnce; Run
// ticks, runs the pass, and logs a failed one the way the Loop's Failed
// says. Each loop's work lives in its own package as a pass; the list of
// loops, and which of them bill, is cmd/billing-consumer's (service.loops).
//
// Like river's maintenance services (a Config, one runOnce, a Run that
// ticks), registered in one place.
//
// No Loop takes an advisory lock here: the two that need one (the
// completer, dedup retention) take it inside their pass, on the connection
// the pass works on, because a pass that finds the lock taken still does
// part of its work (it counts the claims or the partitions for the
// gauges), and because the subcommands that run one pass by hand
// (reconcile, retention) take the same lock. A lock held by Run would cost
// each of them a second connection.
package loop

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Loop is one background loop. The zero values of the optional fields
// (Wait, Timeout, Done, Failed.Every, Failed.OnChange) are the plain loop:
// a pass at once, then one every Interval, each failure logged.
type Loop struct {
	// Name says what the loop does ("ledger completer"), for the reader of
	// the registration list and of a shutdown that timed out.
	Name string
	// Bills is true of a loop that may send a charge (the completer, the
	// deferred decisions). Its context is the billing one: it ends when the
	// schema guard refuses the schema, as the consumer stops. An operator's
	// pause it does not end: each send of its pass asks the pause first
	// (billing.Completer.Paused, pipeline.Config.Gate), so that a pause
	// that begins during a pass stops the next send, and a paused pass
	// still counts what is unsettled for the gauges.
	Bills bool
	// Interval is the time between two passes' starts (a time.Ticker: a
	// pass longer than it is followed by the next at once). Positive.
	Interval time.Duration
	// Wait makes the first pass wait one Interval: for the loops whose
	// first pass startup has already made (the schema check, the pause
	// read).
	Wait bool
	// Timeout, when positive, bounds each pass: a dependency that does not
	// answer delays the next pass rather than piling passes up.
	Timeout time.Duration
	// RunOnce makes one pass. Its error is the pass's failure, logged as
	// Failed says unless the loop is stopping; an error wrapping ErrStop
	// ends the loop instead.
	RunOnce func(ctx context.Context) error
	// Done, when set, is called once as Run returns, with its ended
	// context (a pass that must clean up uses context.WithoutCancel).
	Done func(ctx context.Context)
	// Failed is how a failed pass is logged.
	Failed Log
}

// Log is how a Loop logs its failed passes: Msg at Level with Args and
// the error as "err".
type Log struct {
	Level slog.Level
	Msg   string
	Args  []any
	// Every, when positive, logs at most one failure per Every (the
	// watchers whose gauges carry the state: one line a minute says
	// enough).
	Every time.Duration
	// OnChange logs a failure only when its error differs from the last
	// logged one; a pass that succeeds forgets it.
	OnChange bool
}

// ErrStop, returned (or wrapped) by RunOnce, ends the loop: the schema
// guard once the schema refuses this binary.
var ErrStop = errors.New("loop: stop")

// errPassTimeout is the cause of a pass's context that ran out of the
// Loop's Timeout, as opposed to the loop's context ending.
var errPassTimeout = errors.New("loop: pass timed out")

// Stopping reports whether the loop running the pass that was given ctx
// is stopping (its context ended), rather than the pass running out of
// its Timeout: a pass that reports its answers (the lag gauges) reports
// nothing then.
func Stopping(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), errPassTimeout)
}

// Run runs the loop until ctx ends or a pass returns ErrStop: a pass at
// once (after one Interval with Wait), then one every Interval. A failed
// pass is logged to logger as l.Failed says, and the next tick retries:
// the Interval is the backoff. It returns once the pass in progress has
// returned; a pass must honour ctx.
func (l Loop) Run(ctx context.Context, logger *slog.Logger) {
	if l.Done != nil {
		defer l.Done(ctx)
	}
	t := time.NewTicker(l.Interval)
	defer t.Stop()
	if l.Wait && !tick(ctx, t) {
		return
	}
	var f failures
	for {
		err := l.pass(ctx)
		switch {
		case errors.Is(err, ErrStop):
			return
		case err == nil:
			f.last = ""
		case ctx.Err() == nil:
			f.log(ctx, logger, l.Failed, err)
		}
		if !tick(ctx, t) {
			return
		}
	}
}

// pass runs RunOnce, bounded by Timeout when it is set.
func (l Loop) pass(ctx context.Context) error {
	if l.Timeout <= 0 {
		return l.RunOnce(ctx)
	}
	pctx, cancel := context.WithTimeoutCause(ctx, l.Timeout, errPassTimeout)
	defer cancel()
	return l.RunOnce(pctx)
}

// tick waits for t's next tick and reports whether it came before ctx
// ended.
func tick(ctx context.Context, t *time.Ticker) bool {
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// failures is what a Loop remembers of its failed passes to log them as
// its Log says.
type failures struct {
	logged time.Time // when the last line was logged
	last   string    // the error last logged, "" after a pass succeeded
}

func (f *failures) log(ctx context.Context, logger *slog.Logger, how Log, err error) {
	now := time.Now()
	switch {
	case how.OnChange && err.Error() == f.last:
		return
	case how.Every > 0 && now.Sub(f.logged) <= how.Every:
		return
	}
	f.logged, f.last = now, err.Error()
	logger.Log(ctx, how.Level, how.Msg, append(how.Args[:len(how.Args):len(how.Args)], "err", err)...)
}
