package billing

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
)

// Stray charges (SPEC §11, the 2xx rule): a 2xx whose event's claim was
// gone or another event's when the sender came to record it. With every
// send recorded and the operator refused while one is in flight (I5) this
// does not happen between binaries of this release; a foreign binary, a
// manual DELETE, or a provider that finishes a request past its bound
// still can cause it. The answer is the truth about the money, so it is
// recorded (stray_charge, migration 00011) in the transaction that
// records the sender's other charges, the order's ledger row moves as
// the claim's transition function says (ClaimState.Next, ActorStray),
// and the event's outcome is charged. The charge
// path (record) and the completer (settle) share recordStray.

// StrayCharge is one recorded stray charge.
type StrayCharge struct {
	OrderID int64
	// EventID is the event whose key the provider charged;
	// ProviderChargeID the provider's id for it ("" if none came).
	EventID          uuid.UUID
	ProviderChargeID string
	At               time.Time
	// Sender is who got the 2xx (SenderCreator, SenderRedelivery,
	// SenderCompleter, SenderReconcile).
	Sender string
	// ClaimEventID and ClaimState are the order's ledger row as the 2xx
	// found it (its status column: a parked claim is pending here): zero
	// and ClaimReleased when there was none. Moved is the state the row
	// was left in (ClaimState.Next, ActorStray).
	ClaimEventID uuid.UUID
	ClaimState   ClaimState
	Moved        ClaimState
}

// recordStray records st's 2xx in tx (not committed: the caller commits
// it with the rest) and moves the order's row as the claim's transition
// function says for a stray 2xx (ClaimState.Next, ActorStray). The
// row is read FOR UPDATE; an order whose row appears between the read and
// the insert of the event's own claim is read again, once. Its error is
// the database's: then nothing of it may be committed.
func recordStray(ctx context.Context, tx Tx, st StrayRecord) (StrayCharge, error) {
	out := StrayCharge{OrderID: st.OrderID, EventID: st.EventID, ProviderChargeID: st.ChargeID, Sender: st.Sender,
		ClaimState: ClaimReleased, Moved: ClaimReleased}
	for try := 0; try < 2; try++ {
		owner, status, found, err := tx.LockClaimRow(ctx, st.OrderID)
		switch {
		case err != nil:
			return out, fmt.Errorf("record the stray charge of order %d: read the claim: %w", st.OrderID, err)
		case !found:
			out.ClaimEventID, out.ClaimState = uuid.UUID{}, ClaimReleased
		default:
			out.ClaimEventID, out.ClaimState = owner, status
		}
		next, effects, _ := out.ClaimState.Next(ClaimInput{Actor: ActorStray})
		again, err := strayMove(ctx, tx, st, owner, effects)
		if err != nil {
			return out, err
		}
		if !again {
			out.Moved = next
			break
		}
	}
	var claimEvent *uuid.UUID
	var claimState *ClaimState
	if out.ClaimState != ClaimReleased {
		claimEvent, claimState = &out.ClaimEventID, &out.ClaimState
	}
	at, err := tx.LogStray(ctx, st, claimEvent, claimState)
	if err != nil {
		return out, fmt.Errorf("record the stray charge of order %d: %w", st.OrderID, err)
	}
	out.At = at
	return out, nil
}

// strayMove carries out the row's effects of a stray charge (the record
// itself is recordStray's) and answers whether the order must be read
// again: its own claim could not be inserted, a row appeared meanwhile.
func strayMove(ctx context.Context, tx Tx, st StrayRecord, owner uuid.UUID, effects []Effect) (again bool, _ error) {
	for _, e := range effects {
		switch e {
		case EffectMarkCharged:
			inserted, err := tx.InsertStrayClaim(ctx, st)
			if err != nil {
				return false, fmt.Errorf("record the stray charge of order %d: claim: %w", st.OrderID, err)
			}
			if !inserted {
				return true, nil
			}
		case EffectBlock:
			why := fmt.Sprintf("stray charge: the provider charged this order under event %s (charge %q) while this claim was pending: "+
				"two charges may exist; see claim show", st.EventID, st.ChargeID)
			if err := tx.BlockStrayClaim(ctx, st.OrderID, owner, why); err != nil {
				return false, fmt.Errorf("record the stray charge of order %d: block: %w", st.OrderID, err)
			}
		}
	}
	return false, nil
}

// logStray logs a committed stray charge at ERROR: money moved outside
// the claim that should have held it.
func logStray(ctx context.Context, logger *slog.Logger, sc StrayCharge) {
	what := map[ClaimState]string{
		ClaimCharged: "the order had no claim: recorded as the event's own claim, charged",
		ClaimBlocked: "another event's pending claim blocked for an operator (claim show lists both charges)",
	}[sc.Moved]
	if sc.ClaimState == ClaimCharged || sc.ClaimState == ClaimBlocked {
		what = "the order's claim is another event's, " + string(sc.ClaimState) + ": two charges may exist (claim show lists both)"
	}
	logger.ErrorContext(ctx, "stray charge: a 2xx for a claim that was gone or another event's, recorded", "order_id", sc.OrderID,
		"event_id", sc.EventID, "provider_charge_id", sc.ProviderChargeID, "sender", sc.Sender,
		"claim_event_id", sc.ClaimEventID, "claim_status", sc.ClaimState, "moved", what)
}

// StrayCharges returns the stray charges recorded for order, oldest first,
// for `claim show`. It changes nothing.
func StrayCharges(ctx context.Context, db OperatorStore, order int64) ([]StrayCharge, error) {
	out, err := db.StrayCharges(ctx, order)
	if err != nil {
		return nil, fmt.Errorf("read the stray charges of order %d: %w", order, err)
	}
	for i := range out {
		out[i].Moved, _, _ = out[i].ClaimState.Next(ClaimInput{Actor: ActorStray})
	}
	return out, nil
}
