package billing

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// Billing's storage ports: what the use case needs of its database, in
// its own terms; internal/postgres implements them. Each method is one statement whose guard keeps the
// claim's rule on the row (the lifecycle's transition functions decide;
// the statements only carry their effects out, and never overwrite a row
// that moved meanwhile). Batched methods take parallel slices, one entry
// an event, in the order the caller gives: the caller sorts them by order
// id (byOrder) so that concurrent statements lock ledger rows in one
// order. Unless a method says otherwise, its error carries a fault.Kind
// (Systemic when the database is unreachable, Transient otherwise).

// Ledger is the statements that run either on the store or on a
// completer's session.
type Ledger interface {
	// RecordSends records, committed on its own, that each claim's request
	// is sent by senders[k] (a Sender... name) before it leaves (SPEC §11
	// I5): another attempt's send sets others_sent_at, and the claim's
	// in-flight deadline and decide-after move forward as sends says. It
	// returns the event ids whose claims were still pending (the others
	// moved meanwhile: nothing may be sent for them).
	RecordSends(ctx context.Context, sends SendConfig, orders []int64, ids []uuid.UUID, senders []string) ([]uuid.UUID, error)
	// BlockClaims marks the pending claims of the pairs blocked, with why
	// as their last error, and returns how many it blocked.
	BlockClaims(ctx context.Context, orders []int64, ids []uuid.UUID, why string) (int64, error)
	// Begin starts a transaction (Tx). The caller ends it with Commit or
	// Rollback.
	Begin(ctx context.Context) (Tx, error)
}

// Store is what a Service needs of its database. Each call may run on a
// different connection; it is safe for concurrent use.
type Store interface {
	Ledger
	// ClaimOrders claims the orders of claims in one statement committed
	// on its own, each pending, owned by its event and its attempt's token,
	// its first send recorded (sends, for the replica sends.Host), unless
	// an event of group deferred before it holds the order or the event's
	// dead letter is decided already (SPEC §6 and §11). It answers the
	// events it claimed and those it answered from their dead letter; an
	// event it does not answer was stopped by an existing row (LookupClaims).
	ClaimOrders(ctx context.Context, group string, sends SendConfig, claims []NewClaim) ([]ClaimAnswer, error)
	// LookupClaims returns the ledger rows of the orders, and the rows that
	// hold the event ids on other orders.
	LookupClaims(ctx context.Context, orders []int64, ids []uuid.UUID) ([]Claim, error)
	// HeldBy returns, for each event of the pairs that an event of group
	// deferred before it holds (deferred on the same order), that event.
	HeldBy(ctx context.Context, group string, orders []int64, ids []uuid.UUID) (map[uuid.UUID]uuid.UUID, error)
	// ReleaseClaims deletes the pending claims of the pairs created by the
	// attempt tokens[k], only while no other attempt recorded a send (the
	// release rule on the row), and returns the event ids released.
	ReleaseClaims(ctx context.Context, orders []int64, ids, tokens []uuid.UUID) ([]uuid.UUID, error)
	// RecordDeadLetter stores the dead letter of ev for group (see
	// Service.RecordDeadLetter) and returns the stored decision's reason
	// and error, or ok false when the statement raced with another record
	// of the event and stored nothing (the caller asks again).
	RecordDeadLetter(ctx context.Context, group string, ev events.OrderConfirmed, replayCount int, reason, cause string) (storedReason, storedCause string, ok bool, _ error)
	// Defer stores ev's record rec behind the claim or the deferred event
	// that holds its order, for group (see Service.Defer).
	Defer(ctx context.Context, group string, ev events.OrderConfirmed, rec Record) (bool, error)
	// TakeDeferred leases the next deferred event of group that may be
	// decided now for lease (see Service.TakeDeferred).
	TakeDeferred(ctx context.Context, group string, lease time.Duration) (Deferred, bool, error)
	// FinishDeferred deletes d's row if its lease is still d's.
	FinishDeferred(ctx context.Context, d Deferred) error
	// RetryDeferred makes d's row due again after after, with cause, if its
	// lease is still d's.
	RetryDeferred(ctx context.Context, d Deferred, after time.Duration, cause string) error
	// Park parks ev's own pending claim (same order, customer and amount)
	// for the completer, its first re-send due after firstSend, and stores
	// rec for group as the claim's own deferred row. It reports whether it
	// parked the claim.
	Park(ctx context.Context, group string, ev events.OrderConfirmed, rec Record, firstSend time.Duration) (bool, error)
}

// Tx is one transaction of billing: an event's charge, or a completer's
// settling of a claim. It is used by one goroutine. After Commit or
// Rollback it may not be used, except that Rollback after Commit is a
// no-op.
type Tx interface {
	// MarkProcessed inserts the processed_event rows of ids for group and
	// returns the ids that are new. An id outside the partitions fails the
	// whole call with ErrNoPartition in its chain (no fault.Kind).
	MarkProcessed(ctx context.Context, ids []uuid.UUID, group string, at time.Time) ([]uuid.UUID, error)
	// Unmark deletes the processed_event rows of ids for group.
	Unmark(ctx context.Context, ids []uuid.UUID, group string) error
	// HoldClaims locks the pending claims of the pairs against release or
	// a change of key until the transaction ends (FOR KEY SHARE), in
	// order, and returns the event ids it locked.
	HoldClaims(ctx context.Context, orders []int64, ids []uuid.UUID) ([]uuid.UUID, error)
	// MarkCharged marks the claims of the pairs charged with the provider's
	// charge ids at at, whatever their status (a 2xx is the truth about
	// the money), and returns the event ids it marked.
	MarkCharged(ctx context.Context, orders []int64, ids []uuid.UUID, chargeIDs []string, at time.Time) ([]uuid.UUID, error)
	// BlockClaims is Ledger.BlockClaims in the transaction.
	BlockClaims(ctx context.Context, orders []int64, ids []uuid.UUID, why string) (int64, error)
	// RecordUnknown records that a re-send of the pending claim had an
	// unknown outcome: one more settle attempt, why as its last error, and
	// for a parked claim the next re-send after a doubling backoff capped
	// at backoffMax.
	RecordUnknown(ctx context.Context, order int64, id uuid.UUID, why string, backoffMax time.Duration) error
	// LockClaimRow locks the order's ledger row and returns its event and
	// status column, or found false when the order has no row.
	LockClaimRow(ctx context.Context, order int64) (event uuid.UUID, status ClaimState, found bool, _ error)
	// InsertStrayClaim inserts st as the order's own claim, charged; it
	// reports false when a row appeared meanwhile.
	InsertStrayClaim(ctx context.Context, st StrayRecord) (bool, error)
	// BlockStrayClaim blocks the owner's pending claim of the order, why as
	// its last error.
	BlockStrayClaim(ctx context.Context, order int64, owner uuid.UUID, why string) error
	// LogStray appends st to the stray charges, with the order's claim as
	// the 2xx found it (claimEvent and claimState nil for no row), and
	// returns when it was recorded.
	LogStray(ctx context.Context, st StrayRecord, claimEvent *uuid.UUID, claimState *ClaimState) (time.Time, error)
	// Commit commits the transaction.
	Commit(ctx context.Context) error
	// Rollback rolls the transaction back; the caller runs it on a
	// context that outlives its own, and may ignore its error.
	Rollback(ctx context.Context) error
}

// NewClaim is one claim ClaimOrders makes: an event's order, its
// parameters, the claim token of the attempt, and the dlq-replay-count of
// the record it decides.
type NewClaim struct {
	OrderID, CustomerID int64
	EventID             uuid.UUID
	Amount              money.Amount
	Attempt             uuid.UUID
	ReplayCount         int
}

// ClaimAnswer is ClaimOrders's answer for one event: claimed (Decided
// false), or answered by its decided dead letter's reason and error.
type ClaimAnswer struct {
	EventID       uuid.UUID
	Decided       bool
	Reason, Cause string
}

// StrayRecord is a 2xx for a claim that was gone or another event's (see
// StrayCharge), as the Tx's stray statements record it.
type StrayRecord struct {
	OrderID, CustomerID int64
	EventID             uuid.UUID
	Amount              money.Amount
	ChargeID            string
	Sender, Host        string
	ChargedAt           time.Time
}

// ErrNoPartition says that an event's UUIDv7 time falls outside the
// processed_event partitions (Tx.MarkProcessed): the ledger alone decides
// it (SPEC §6).
var ErrNoPartition = errors.New("event time outside the processed_event partitions")
