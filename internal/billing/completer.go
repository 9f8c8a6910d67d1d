package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/field"
)

// SettledMeanwhile is the Settled.Result of a claim that was released or
// settled between the pass's read and its send: nothing was sent.
const SettledMeanwhile = "settled meanwhile"

// completerLockKey is the Postgres advisory lock that lets one replica at a
// time settle claims ("complete" in ASCII).
const completerLockKey int64 = 0x636f6d706c657465

// Completer settles pending ledger claims that their events have not
// settled: the event was dead-lettered, its partition moved on, or the
// process that made the claim died. For each pending claim older than
// After it records that it sends (charge.others_sent_at, committed before
// the request leaves), re-sends the claim's request — the claiming
// event's Idempotency-Key with the body rebuilt from the claim,
// byte-identical to the original — and settles it as ClaimState.Next says
// for ActorCompleter:
//
//	2xx                      charged, with the provider's charge id
//	422                      blocked (the key is bound to other parameters)
//	400, 402, 404            blocked: the completer never created the
//	                         claim, so a refusal may not release it
//	timeout, reset, 5xx, 409 still pending
//	(claim older than        blocked without a re-send: the provider may
//	BlockAfter)              have forgotten the key
//	401, 403, certificate    the pass stops: nothing can be settled now
//	(an operator's pause)    the pass stops before the claim, or right
//	                         before its request: nothing sent or changed
//
// A blocked claim is never released automatically: an operator decides.
// Several replicas may run a Completer: an advisory lock lets one of them
// settle at a time (the others only report the counts).
//
// It also owns the parked claims (park.go): the passes of its loop
// (Passes) between its full ones re-send those due, from a second after
// the park. The events deferred behind a claim (deferred.go) are not the
// Completer's: they are decided by pipeline.Handler.DecideDeferred once
// the claim they wait on is settled here or by its event. The files:
// completer.go (the type, a pass, Passes, the counts), settle.go
// (settling one claim), park.go.
type Completer struct {
	// Sessions gives the completer a session for each pass (one
	// connection, on which it takes its advisory lock).
	Sessions Sessions
	Charger  Charger
	// After is the age from which a pending claim is settled here rather
	// than left to its event's own retries.
	After time.Duration
	// BlockAfter is the age past which a claim whose outcome is still
	// unknown becomes blocked. It must stay well below the provider's
	// retention of idempotency keys: a key the provider has forgotten
	// would charge again.
	BlockAfter time.Duration
	// DBTimeout bounds each statement; zero means 10 s.
	DBTimeout time.Duration
	// Limit is the most claims settled in one pass; zero means 100.
	Limit int
	// ParkedEvery is how often the loop (Passes) looks for parked claims
	// due between its full passes; zero means 1 s. ParkedBackoffMax caps a parked
	// claim's re-send backoff (from 1 s, doubling); zero means 10 s.
	ParkedEvery, ParkedBackoffMax time.Duration
	// Sends is how its sends are recorded before they leave (SPEC §11
	// I5), and Sender the name they are recorded under: SenderCompleter
	// ("" too) or SenderReconcile.
	Sends  SendConfig
	Sender string
	// Now stamps charged_at on the claims the completer charges. Ages of
	// claims (After, BlockAfter, the counts) are the database's clock,
	// never this one (SPEC §10).
	Now    func() time.Time
	Logger *slog.Logger
	// Paused reports whether an operator's pause is in force (SPEC §11
	// I4); nil means never paused. A pass consults it before each claim
	// it would change and again right before each request leaves; once it
	// says paused, the pass sends and changes nothing more and reports
	// PassReport.Paused (its counts are still read, unless SkipCount).
	// Claims are not blocked during a pause either: blocking sends nothing,
	// but the pause is an operator's word that the ledger stands still. It
	// is called from the pass's goroutine, once or twice per claim.
	Paused func() bool
}

// Unsettled counts the ledger claims that are not charged.
type Unsettled struct {
	Pending, Blocked int
	// Parked counts the pending claims that are parked (a subset of
	// Pending): their events' records were committed, the completer owns
	// them.
	Parked int
	// Deferred counts the deferred events (deferred_event, every group):
	// their records were committed, their decisions wait (SPEC §10). A
	// parked event's own row (park.go) is left out while its claim is
	// pending and parked, counted in Parked: Parked + Deferred counts each
	// waiting event once.
	Deferred int
	// OldestPending is the age of the oldest pending claim, 0 without one.
	OldestPending time.Duration
	// StrayBeside counts the orders with a stray charge (stray.go) beside
	// another event's charged claim, under another provider charge id: two
	// charges, for an operator (the claim's own charge and the stray's).
	StrayBeside int
}

// Settled is what a pass did to one claim.
type Settled struct {
	Claim
	// Result is "charged", "blocked", "pending" (still unknown), "settled
	// meanwhile" (released or settled since the pass read it: nothing
	// sent), or, in a dry run, "would re-send" or "would block".
	Result string
	// Detail is the charge id, or why the claim is blocked or pending.
	Detail string
}

// PassReport is what one pass did.
type PassReport struct {
	// Skipped is true when another process held the completer's lock.
	Skipped bool
	// Paused is true when the pass stopped at an operator's pause
	// (Completer.Paused): Settled holds what it did before.
	Paused  bool
	Settled []Settled
	// Blocked are the blocked claims (the oldest 100), each with the
	// completer's last word on it, for an operator; only with
	// PassOptions.ListBlocked.
	Blocked []Settled
	// Unsettled counts the claims after the pass, when Counted.
	Unsettled Unsettled
	Counted   bool
}

// PassOptions tune one pass.
type PassOptions struct {
	// OlderThan overrides After when positive.
	OlderThan time.Duration
	// DryRun lists the claims that would be settled without sending
	// anything or changing the ledger.
	DryRun bool
	// ListBlocked also reads the blocked claims into the report (reconcile
	// shows them; the service's own passes need only their count).
	ListBlocked bool
	// ParkedOnly settles only the parked claims whose re-send is due (the
	// service's passes between its full ones).
	ParkedOnly bool
	// SkipCount leaves the claims uncounted (Counted false): see Passes.
	SkipCount bool
}

// Sessions is where a Completer gets its session for a pass.
type Sessions interface {
	// Acquire returns a session; the caller releases it.
	Acquire(ctx context.Context) (Session, error)
}

// Session is one connection of the database held for a completer's pass:
// the advisory lock it takes is the session's, and every statement of
// the pass runs on it. It is used by one goroutine; its errors carry a
// fault.Kind, like the Store's.
type Session interface {
	Ledger
	// TryLock takes the advisory lock key without waiting (each statement
	// bounded by timeout); unlock releases it, on a context of its own.
	// locked is false when another session holds it.
	TryLock(ctx context.Context, key int64, timeout time.Duration) (unlock func(), locked bool, err error)
	// StaleClaims returns up to limit pending claims older than olderThan
	// and the parked ones whose next re-send is due, oldest first.
	StaleClaims(ctx context.Context, olderThan time.Duration, limit int) ([]Claim, error)
	// ParkedDue returns up to limit parked claims whose next re-send is
	// due, the most overdue first.
	ParkedDue(ctx context.Context, limit int) ([]Claim, error)
	// CountUnsettled counts the claims that are not charged.
	CountUnsettled(ctx context.Context) (Unsettled, error)
	// BlockedClaims returns the oldest 100 blocked claims, each with its
	// last error as Detail.
	BlockedClaims(ctx context.Context) ([]Settled, error)
	// Release ends the session.
	Release()
}

// Validate returns nil when the completer's ages are usable, or the
// errors.Join of a *field.Error for each field that is not: After must be
// positive, and BlockAfter above it (a claim is settled here before it
// may be blocked). RunOnce checks it first.
func (c *Completer) Validate() error {
	var errs []error
	if c.After <= 0 {
		errs = append(errs, field.Errorf("After", "must be positive, got %s", c.After))
	}
	if c.BlockAfter <= c.After {
		errs = append(errs, field.Errorf("BlockAfter", "must exceed %s (%s), got %s", field.Ref("After"), c.After, c.BlockAfter))
	}
	return errors.Join(errs...)
}

// RunOnce makes one pass. Its error is a failure of the pass itself (the
// database, or a systemic answer of the provider); claims it could not
// settle are reported, not errors.
func (c *Completer) RunOnce(ctx context.Context, opt PassOptions) (PassReport, error) {
	if err := c.Validate(); err != nil {
		return PassReport{}, fmt.Errorf("completer: %w", err)
	}
	sess, err := c.Sessions.Acquire(ctx)
	if err != nil {
		return PassReport{}, fmt.Errorf("completer: %w", err)
	}
	defer sess.Release()
	var rep PassReport
	if !opt.DryRun {
		unlock, locked, err := sess.TryLock(ctx, completerLockKey, c.dbTimeout())
		if err != nil {
			return rep, fmt.Errorf("completer lock: %w", err)
		}
		if !locked {
			rep.Skipped = true
		} else {
			defer unlock()
		}
	}
	if !rep.Skipped {
		rep.Settled, err = c.settleStale(ctx, sess, opt)
		if errors.Is(err, ErrPaused) {
			rep.Paused, err = true, nil
		}
	}
	var uerr, berr error
	if !opt.SkipCount {
		rep.Unsettled, uerr = c.count(ctx, sess)
		rep.Counted = uerr == nil
	}
	if opt.ListBlocked && rep.Unsettled.Blocked > 0 {
		rep.Blocked, berr = c.blocked(ctx, sess)
	}
	return rep, errors.Join(err, uerr, berr)
}

// blocked reads the blocked claims with their last error.
func (c *Completer) blocked(ctx context.Context, sess Session) ([]Settled, error) {
	qctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	defer cancel()
	out, err := sess.BlockedClaims(qctx)
	if err != nil {
		return nil, fmt.Errorf("completer: read blocked claims: %w", err)
	}
	return out, nil
}

// count reads the unsettled claims.
func (c *Completer) count(ctx context.Context, sess Session) (Unsettled, error) {
	qctx, cancel := context.WithTimeout(ctx, c.dbTimeout())
	defer cancel()
	u, err := sess.CountUnsettled(qctx)
	if err != nil {
		return u, fmt.Errorf("completer: count claims: %w", err)
	}
	return u, nil
}

// Passes returns the completer's loop (see internal/loop): it ticks every
// tick, min(interval, ParkedEvery), and each pass, runOnce, is a full pass
// when interval has passed since the last full one (the first is), and a
// pass over the parked claims due otherwise. onPass, when not nil, sees
// every pass's report (whatever failed): the service counts what it
// settled, and sets the ledger gauges from its counts only when
// rep.Counted, so that a pass that could not count leaves the gauges as
// they were rather than zeroing them. runOnce's error is RunOnce's; it
// is called by one goroutine at a time.
//
// A full pass counts the claims; a parked pass only while the last count
// saw parked claims or deferred events, or failed, so that the gauges
// follow them every tick while there are some. A claim parked after a
// count that saw none shows in the gauges at the next full pass. A
// healthy stream has none and is counted once an interval: the count
// scans every unsettled claim (each in-flight event's among them), which
// a one-second tick made about 2% of Postgres's CPU in a saturated drain.
func (c *Completer) Passes(interval time.Duration, onPass func(PassReport)) (tick time.Duration, runOnce func(context.Context) error) {
	var lastFull time.Time
	waiting := false // the last count saw parked claims or deferred events
	return min(interval, c.parkedEvery()), func(ctx context.Context) error {
		opt := PassOptions{ParkedOnly: true, SkipCount: !waiting}
		if now := time.Now(); now.Sub(lastFull) >= interval {
			opt, lastFull = PassOptions{}, now
		}
		rep, err := c.RunOnce(ctx, opt)
		switch {
		case rep.Counted:
			waiting = rep.Unsettled.Parked+rep.Unsettled.Deferred > 0
		case !opt.SkipCount:
			waiting = true // the count failed: count again at the next tick
		}
		if onPass != nil {
			onPass(rep)
		}
		return err
	}
}

func (c *Completer) dbTimeout() time.Duration {
	if c.DBTimeout > 0 {
		return c.DBTimeout
	}
	return 10 * time.Second
}
