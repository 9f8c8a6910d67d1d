// Package billing is the use case of billing-consumer: one validated
// order.confirmed event in, one outcome out, with the order charged at the
// provider at most once, ever (SPEC §6).
//
// Processing an event has two phases, after Brandur Leach's "atomic
// phases" and Stripe's idempotency keys:
//
//  1. The claim (ledger.go), committed before any money moves: the order's
//     charge row is inserted as 'pending', owned by the event's event_id,
//     with the customer and canonical amount that rebuild the exact
//     request. If the order already has a row, decide says what that
//     means: Duplicate, DuplicateOrder, a Conflict, the event's own
//     pending claim (charge again, same key), Busy (another event's
//     charge is unsettled: wait), or held (a blocked claim, the event's own
//     or another's: deferred until an operator decides it, held.go).
//     Nothing else can charge a claimed order.
//  2. The charge (charge.go). An attempt that did not create the claim
//     first records that it sends (charge.others_sent_at, committed on its
//     own), so that the creator can no longer release the claim under a
//     request that may take money. Then one transaction: the
//     processed_event insert (ON CONFLICT DO NOTHING; no row means
//     Duplicate), the POST with Idempotency-Key: <event_id> and the
//     canonical body, the claim marked 'charged' with the provider's
//     charge id, COMMIT. Then the caller commits the offset.
//
// When the charge's outcome is unknown (timeout, reset, 5xx, a lost
// database connection, a crash) the transaction rolls back, taking the
// processed_event row with it, and the claim stays 'pending': the event's
// redelivery or the Completer re-sends the same request and the provider
// answers from its stored result. What a claim's answer does to it is
// ClaimState.Next's (lifecycle.go), the one transition function of the
// money path, which every actor decides through (the attempts of the
// event, the completer and reconcile, a stray 2xx, the operator) and whose
// effects each caller carries out with statements that guard the same
// rule; a deferred event's lifecycle is DeferredState.Next's
// (deferred_lifecycle.go):
// a definite refusal deletes the claim only when the attempt that created
// it was refused, none of its requests had an unknown outcome and no
// other attempt recorded a send; a 422 marks it 'blocked' for an
// operator. No rollback ever erases the only record that money may have
// moved.
//
// SPEC §11's invariants, and where each is kept:
//
//   - I1, once: the claim (claimSQL) and ClaimState.Next's release rule;
//     a claim is released only by its creator's definite refusal, or by an
//     operator once no request can still be processed (I5) and no stray
//     charge is recorded for the order.
//   - I2, one true decision: decide (ledger.go) answers a conflict only for
//     a true one; everything else behind a claim waits or is held.
//   - I3, a path to the charge: an event behind a blocked claim is held
//     (held.go) and deferred; a parked event keeps its record (park.go).
//   - I4, pause means pause: every sender asks Config.Paused or the
//     completer's Paused before each request (pause.go).
//   - I5, no decision races a request: every send is recorded with its
//     deadline before it leaves (sends.go), and the operator waits it out
//     (inflight.go).
//
// Billing declares what it needs of its database as small ports in its
// own terms (store.go: Store and Tx for the service; completer.go:
// Sessions for the completer; operator.go: OperatorStore for the
// operator's commands); the statements
// named here and in the comments of this package (claimSQL, recordSQL,
// markSentSQL, …) are the Postgres adapter's, internal/postgres, which
// implements those ports and alone speaks to Postgres.
//
// lifecycle_*_test.go checks all five over every interleaving of a
// bounded model whose steps call these functions (decide, ClaimState.Next,
// DeferredState.Next, policy.Decide) and the statements' guards written as
// functions; internal/modelcheck is the explorer.
package billing

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// Charger takes one charge at the payment provider: billing's port, which
// an adapter implements (payment.Client.ForBilling in production). It must
// send the same body for the same request every time, and its errors carry
// a fault.Kind: Permanent for a refusal of the charge, Conflict for a 422,
// Systemic when the request was not accepted for reasons that are not the
// charge's, Transient when the outcome is unknown. An error that proves the
// money was not taken says so with a method NotTaken() bool returning true
// (as *payment.Error does): only then may the attempt that created the
// claim release it. A refusal of a request that the client may have
// written more than once (a transport's silent replay on a new
// connection) proves nothing: NotTaken must be false for it.
type Charger interface {
	Charge(ctx context.Context, req ChargeRequest) (ChargeResult, error)
}

// ChargeRequest is one charge as billing asks for it. Every attempt for
// the same event carries the same request: the provider recognises a
// repeated attempt by its IdempotencyKey (the event_id) and refuses
// another body under the same key.
type ChargeRequest struct {
	IdempotencyKey string
	OrderID        int64
	CustomerID     int64
	Amount         money.Amount
}

// ChargeResult is the provider's acceptance of a charge.
type ChargeResult struct {
	// ChargeID is the provider's charge id, or "" when its answer carried
	// none: the money was taken either way.
	ChargeID string
}

// Outcome is what processing an event did. Its values are the result label
// of billing_events_total.
type Outcome string

// Outcomes of Process.
const (
	// Charged: the order was charged and recorded.
	Charged Outcome = "charged"
	// Duplicate: this event was processed before; nothing was done.
	Duplicate Outcome = "duplicate"
	// DuplicateOrder: another event already charged this order with the
	// same amount; nothing was charged.
	DuplicateOrder Outcome = "duplicate_order"
)

// Result is the outcome of one event.
type Result struct {
	Outcome Outcome
	// ChargeID is the provider's charge id, for Charged.
	ChargeID string
	// DedupBypassed is true when the event's UUIDv7 time fell outside the
	// processed_event partitions and the ledger alone decided (SPEC §6).
	DedupBypassed bool
}

// Config configures a Service. Store, Charger, Group, Now and Logger are
// required.
type Config struct {
	// Store is the service's database (store.go; internal/postgres's
	// Store in production).
	Store   Store
	Charger Charger
	// Group is the consumer group, the consumer_group of processed_event.
	Group  string
	Now    func() time.Time
	Logger *slog.Logger
	// DBTimeout bounds every database statement, so that a connection
	// that silently drops packets fails the attempt instead of hanging it
	// past the group's session timeout. Zero means 10 s.
	DBTimeout time.Duration
	// ClaimBlockAfter is BILLING_CLAIM_BLOCK_AFTER, the Completer's
	// BlockAfter: an event never re-sends its own pending claim older than
	// this (the provider may have forgotten the key, and a forgotten key
	// charges again): it blocks the claim and is held behind it (ErrHeld).
	// Zero means no limit.
	ClaimBlockAfter time.Duration
	// Sends says how every send of a claim's request is recorded before it
	// leaves (SPEC §11 I5): the sender's deadline D and the provider's
	// bound, and this replica's name.
	Sends SendConfig
	// Paused reports whether an operator's pause is in force (SPEC §11
	// I4); nil means never paused. Process consults it before it claims
	// and again right before the requests leave, and answers ErrPaused
	// when it says paused (see pause.go). Safe for concurrent calls.
	Paused func() bool
}

// Service processes events. It is safe for concurrent use; concurrent
// calls for the same event or the same order are serialized by the claim.
type Service struct {
	store     Store
	charger   Charger
	group     string
	now       func() time.Time
	logger    *slog.Logger
	dbTimeout time.Duration
	// claimBlockAfter is Config.ClaimBlockAfter.
	claimBlockAfter time.Duration
	sends           SendConfig
	// pausedFn is Config.Paused.
	pausedFn func() bool
}

// New returns a Service, or an error naming what cfg lacks.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Charger == nil || cfg.Group == "" || cfg.Now == nil || cfg.Logger == nil {
		return nil, errors.New("billing: store, charger, group, clock and logger are required")
	}
	if cfg.DBTimeout <= 0 {
		cfg.DBTimeout = 10 * time.Second
	}
	return &Service{store: cfg.Store, charger: cfg.Charger, group: cfg.Group, now: cfg.Now,
		logger: cfg.Logger, dbTimeout: cfg.DBTimeout, claimBlockAfter: cfg.ClaimBlockAfter, sends: cfg.Sends.withDefaults(), pausedFn: cfg.Paused}, nil
}

// Process charges the order of ev at most once, ever.
//
// A nil error comes with Charged, Duplicate or DuplicateOrder. Errors carry
// a fault.Kind:
//   - Conflict: the order was charged by another event with other
//     parameters, ev's event_id claimed another order or a different
//     body, or the provider answered 422;
//   - Permanent: the provider refused the charge;
//   - Busy: another event's claim on the order is unsettled; retry later.
//     With ErrHeld in its chain: the order's claim, ev's own or another
//     event's, is blocked (ev's own pending claim older than
//     ClaimBlockAfter is blocked now, not re-sent): an operator decides,
//     so defer ev (Defer) rather than wait;
//   - Systemic: credentials rejected, database unreachable;
//   - Transient: the outcome is unknown or the database failed; retry.
//
// ErrPaused (Busy) says that an operator's pause stopped it before any
// request was sent (Config.Paused).
//
// After an error the event is not marked processed, so it can be retried
// or dead-lettered; its order's claim stays as SPEC §6 requires.
func (s *Service) Process(ctx context.Context, ev events.OrderConfirmed) (Result, error) {
	r := s.processAll(ctx, []events.OrderConfirmed{ev}, []*attempt{attemptOf(ctx)}, nil)[0]
	return r.res, r.err
}

type attemptKey struct{}

// attempt is one attempt at charging an event (see WithAttempt).
type attempt struct {
	// id is the claim_token of the claims this attempt creates.
	id uuid.UUID
	// unknown is set once a request of this attempt was sent and its
	// outcome stayed unknown (timeout, reset, 5xx, a 2xx not recorded).
	// From then on a refusal proves nothing about that earlier request
	// (a gateway's 404, a WAF's 403, a decline while the first request is
	// still in flight), so the attempt may no longer release its claim:
	// it is left pending, for the completer.
	unknown atomic.Bool
	// replay is the dlq-replay-count of the record this attempt decides
	// (WithReplayCount): a stored dead-letter decision of the event
	// answers it unless it is higher.
	replay int
}

// WithAttempt returns a context that makes every Process call under it one
// attempt at charging: the pipeline wraps the processing of one delivery,
// its retries included. Only the attempt that created an order's claim may
// release it on a definite refusal (SPEC §6), and only while none of its
// requests had an unknown outcome; a redelivery, the completer and
// reconcile are other attempts. Without it, each Process call is an
// attempt of its own. The attempt decides a record with the
// dlq-replay-count that WithReplayCount put in ctx before, if any.
func WithAttempt(ctx context.Context) context.Context {
	if _, ok := ctx.Value(attemptKey{}).(*attempt); ok {
		return ctx
	}
	return context.WithValue(ctx, attemptKey{}, &attempt{id: uuid.New(), replay: replayCountOf(ctx)})
}

// attemptOf returns ctx's attempt, or a fresh one.
func attemptOf(ctx context.Context) *attempt {
	if a, ok := ctx.Value(attemptKey{}).(*attempt); ok {
		return a
	}
	return &attempt{id: uuid.New(), replay: replayCountOf(ctx)}
}

// chargeOf is the charge request of ev: key and body derive from the event
// alone, never from the attempt.
func chargeOf(ev events.OrderConfirmed) ChargeRequest {
	return chargeRequest(ev.EventID.String(), ev.OrderID, ev.CustomerID, ev.TotalAmount)
}

func chargeRequest(key string, order, customer int64, amount money.Amount) ChargeRequest {
	return ChargeRequest{IdempotencyKey: key, OrderID: order, CustomerID: customer, Amount: amount}
}

// live bounds a statement that may be cancelled with ctx.
func (s *Service) live(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.dbTimeout)
}

// detached bounds a statement that must finish even when ctx has ended:
// recording what the provider answered, a rollback, a release.
func (s *Service) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.dbTimeout)
}
