package billing

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// The claim's lifecycle, written once (SPEC §11): its states, who moves
// them, and ClaimState.Next, the one pure transition function that every
// path decides through — the per-event service and the Batcher (the send:
// claimWon in sends.go, ledger.go's decide, and chargeAll's pause; a 2xx
// and a failure: charge.go), parking (park.go), the completer and parked
// re-sends, reconcile (settle.go), a stray 2xx (stray.go) and the operator
// (operator.go).
// Next returns effects as values; the caller carries them out with the
// storage statements, each of which keeps the same rule as its guard
// (WHERE status = ...), so that a row that moved meanwhile is never
// overwritten (lifecycle_conformance_test.go runs each against the model).
// The deferred event's lifecycle is deferred_lifecycle.go's.

// ClaimState is the state of an order's claim in the charge ledger. It is
// derived from the row by ClaimStateOf — charge.status, and parked_at for
// a parked claim — or ClaimReleased when the order has no row. Only the
// values pending, blocked and charged are ever written to the column: the
// previous release reads it and must never see another (parked is a
// pending row with parked_at set).
type ClaimState string

const (
	// ClaimPending: the order is claimed by its event (event_id, and the
	// claim_token of the attempt that created it); the outcome of its
	// charge is not known yet. Only requests of that event (same key, same
	// body) are ever sent for it. Moved by its creator (to charged,
	// released or blocked), by another attempt of the event — a
	// redelivery, the same delivery elsewhere — (to charged, blocked or
	// parked), by the completer or reconcile (to charged or blocked), by a
	// stray 2xx of another event (to blocked), or by an operator (to
	// charged).
	ClaimPending ClaimState = "pending"
	// ClaimParked: a pending claim whose event's attempt handed it to the
	// completer (Park: parked_at set, and others_sent_at, so no attempt
	// releases it any more); its record waits in a deferred row. Moved by
	// the completer's re-sends (to charged or blocked), by a redelivery of
	// its event (to charged or blocked), by a stray 2xx (to blocked), or
	// by an operator (to charged).
	ClaimParked ClaimState = "parked"
	// ClaimCharged: the provider took the charge; provider_charge_id holds
	// its id. Final: no actor moves it.
	ClaimCharged ClaimState = "charged"
	// ClaimBlocked: the provider answered 422, a sender other than the
	// creator was refused, a stray 2xx came for the order, or the outcome
	// stayed unknown past BILLING_CLAIM_BLOCK_AFTER (the provider may have
	// forgotten the key). Moved only by an operator (to charged, or to
	// released when the provider holds no charge for the order), or by a
	// 2xx for its key (to charged: that answer is the truth about the
	// money).
	ClaimBlocked ClaimState = "blocked"
	// ClaimReleased: the order has no row, and is free for another event.
	// Its creator moves a pending claim here on a definite refusal, while
	// none of its requests had an unknown outcome and no other attempt has
	// recorded a send (then no request can have taken money); an operator
	// moves a blocked one here. A stray 2xx for an order without a row
	// moves it to charged (the event's own claim).
	ClaimReleased ClaimState = "released"
)

// ClaimStateOf is the state of a row read with the given status column
// and whether its parked_at is set: the one place a scan derives it.
func ClaimStateOf(status string, parked bool) ClaimState {
	if status == string(ClaimPending) && parked {
		return ClaimParked
	}
	return ClaimState(status)
}

// column is the charge.status value of s: pending for a parked claim.
func (s ClaimState) column() string {
	if s == ClaimParked {
		return string(ClaimPending)
	}
	return string(s)
}

// Unsettled reports whether s is pending or parked: the charge's outcome
// is not known, and the claim's request may be sent again.
func (s ClaimState) Unsettled() bool { return s == ClaimPending || s == ClaimParked }

// Answer is what a send of a claim's request got, in the lifecycle's terms.
type Answer int

const (
	// AnswerNone: nothing sent yet; the question is whether to send.
	AnswerNone Answer = iota
	// AnswerCharged: a 2xx.
	AnswerCharged
	// AnswerRefused: a definite refusal that proves the money was not taken
	// (NotTaken: 400, 402, 404, 401, 407, a certificate rejected before any
	// connection), of a request written at most once.
	AnswerRefused
	// AnswerConflict: 422 (the key is bound to other parameters), or a
	// request that cannot be made at all (Invalid).
	AnswerConflict
	// AnswerUnknown: anything else (timeout, reset, 5xx, 409, 429, 403, a
	// refusal of a silent replay): the money may have moved.
	AnswerUnknown
)

// answerOf maps a Charger's error to an Answer.
func answerOf(err error) Answer {
	switch k := fault.KindOf(err); {
	case err == nil:
		return AnswerCharged
	case k == fault.Conflict, k == fault.Invalid:
		return AnswerConflict
	case definiteRefusal(err):
		return AnswerRefused
	default:
		return AnswerUnknown
	}
}

// Actor is who acts on a claim.
type Actor int

const (
	// ActorCreator is the attempt whose claim_token the claim carries: one
	// delivery's processing, its retries included (WithAttempt).
	ActorCreator Actor = iota
	// ActorEvent is another attempt of the claim's event: a redelivery, or
	// the same delivery on another replica.
	ActorEvent
	// ActorCompleter is the completer of a running service (parked
	// re-sends included) or reconcile.
	ActorCompleter
	// ActorOperator is `billing-consumer claim release|mark-charged`
	// (ClaimInput.Operator says which).
	ActorOperator
	// ActorStray is a 2xx for an event whose claim is gone or another
	// event's; the state is then the order's row (ClaimReleased for none).
	ActorStray
)

// definiteRefusal reports whether a charge error proves that the provider
// did not take the money: the Charger's error says so with a NotTaken
// method (*payment.Error: a refusal of the charge, of our credentials, or
// a request never sent).
func definiteRefusal(err error) bool {
	var nt interface{ NotTaken() bool }
	return errors.As(err, &nt) && nt.NotTaken()
}

// actorOf is the charge path's sender in the claim's lifecycle: the
// attempt that created the claim, or another attempt of its event.
func actorOf(created bool) Actor {
	if created {
		return ActorCreator
	}
	return ActorEvent
}

// Effect is one thing a transition asks its caller to do, in the order
// Next lists them.
type Effect int

const (
	// EffectRecordSend: record, committed, that the actor sends the
	// claim's request, until when (markSent, or claimSQL for the
	// creator's first send), before it leaves (SPEC §11 I5).
	EffectRecordSend Effect = iota + 1
	// EffectSend: send the claim's request (same key and body).
	EffectSend
	// EffectMarkCharged: record the claim charged (recordSQL,
	// markChargedSQL; for ActorStray on no row, the event's own claim
	// inserted charged: strayClaimSQL).
	EffectMarkCharged
	// EffectBlock: mark the pending claim blocked for an operator
	// (blockSQL, strayBlockSQL).
	EffectBlock
	// EffectRelease: delete the row (releaseSQL for the creator,
	// releaseClaimSQL for an operator).
	EffectRelease
	// EffectPark: hand the pending claim to the completer, its record
	// kept in a deferred row (parkSQL).
	EffectPark
	// EffectRecordUnknown: count the completer's re-send whose outcome
	// stayed unknown and schedule a parked claim's next one
	// (stillUnknownSQL).
	EffectRecordUnknown
	// EffectRecordStray: record the 2xx as a stray charge (strayLogSQL).
	EffectRecordStray
	// EffectAudit: write the operator's decision to claim_audit.
	EffectAudit
)

// The effect lists Next returns. They are package-level values, so that
// Next allocates nothing on the per-event path (it decides every send and
// every 2xx's record), and they are read-only: a caller reads them
// (slices.Contains) and never writes to them. Each one's capacity is its
// length, so an append copies it.
var (
	effectsSend            = []Effect{EffectRecordSend, EffectSend}
	effectsCharged         = []Effect{EffectMarkCharged}
	effectsBlock           = []Effect{EffectBlock}
	effectsRelease         = []Effect{EffectRelease}
	effectsPark            = []Effect{EffectPark}
	effectsUnknown         = []Effect{EffectRecordUnknown}
	effectsStray           = []Effect{EffectRecordStray}
	effectsStrayClaim      = []Effect{EffectMarkCharged, EffectRecordStray}
	effectsStrayBlock      = []Effect{EffectBlock, EffectRecordStray}
	effectsOperatorRelease = []Effect{EffectRelease, EffectAudit}
	effectsOperatorCharged = []Effect{EffectMarkCharged, EffectAudit}
)

// ClaimInput is what a claim's next state depends on.
type ClaimInput struct {
	Actor  Actor
	Answer Answer
	// Park: the event's attempt asks to hand its pending claim to the
	// completer (policy.Park); Answer is AnswerNone.
	Park bool
	// Paused: an operator's pause is in force; nothing is sent.
	Paused bool
	// OthersSent: an attempt other than the creator has recorded that it
	// sends the claim's request (charge.others_sent_at, always set on a
	// parked claim). The release statement evaluates it again on the row.
	OthersSent bool
	// UnknownSeen: one of the actor's own requests for the claim had an
	// unknown outcome.
	UnknownSeen bool
	// Age is the claim's age by the database's clock; BlockAfter is
	// BILLING_CLAIM_BLOCK_AFTER, 0 for no limit.
	Age, BlockAfter time.Duration
	// Operator is ActorOperator's move and the facts that may refuse it.
	Operator OperatorMove
}

// OperatorMove is an operator's request on a claim with the facts it is
// decided by.
type OperatorMove struct {
	Action OperatorAction
	// ProviderHoldsNoCharge and ChargeID are OperatorRequest's.
	ProviderHoldsNoCharge bool
	ChargeID              string
	// StrayCharges counts the stray charges recorded for the order
	// (stray_charge): the provider holds money for it under another key.
	StrayCharges int
	// Window is what says whether a request may still be in flight
	// (SPEC §11 I5), read with the claim locked.
	Window InFlightFacts
}

// Next is the claim's one transition function: from s, by in, the next
// state and the effects to carry out, or an error and no effect. For the
// senders (creator, event, completer), s is the actor's own claim:
//
//	answer         creator (nothing unknown,  creator otherwise,  completer,
//	               no other sender)           event attempt       reconcile
//	none           record send, send          the same            the same
//	none, paused   ErrPaused                  ErrPaused           ErrPaused
//	none, age >    blocked (not sent)         blocked             blocked
//	  block-after
//	park           parked                     parked              -
//	2xx            charged                    charged             charged
//	422, invalid   blocked                    blocked             blocked
//	refused        released                   unchanged           blocked
//	unknown        unchanged                  unchanged           unchanged, counted
//
// Parked answers as pending. A blocked claim moves only on a 2xx (to
// charged); a charged one records a 2xx again, nothing else. A refused
// request of an attempt that may not release the claim leaves it for the
// completer, whose re-send gets the provider's stored answer or, refused
// too, blocks it. A systemic answer (credentials, a redirect) is the
// caller's before this: it is no news about the claim.
//
// ActorStray (the 2xx rule, SPEC §11), s the order's row: the 2xx is
// recorded in every case; no row: the event's own claim, charged; another
// event's pending or parked claim: blocked, an operator decides with both
// charges in view; charged or blocked: unchanged (logged at ERROR).
//
// ActorOperator: operatorNext.
//
// The effects are read-only lists shared by every call (never modify
// them): Next allocates nothing, except an operator refusal's error.
func (s ClaimState) Next(in ClaimInput) (ClaimState, []Effect, error) {
	switch in.Actor {
	case ActorOperator:
		return s.operatorNext(in.Operator)
	case ActorStray:
		switch s {
		case ClaimReleased:
			return ClaimCharged, effectsStrayClaim, nil
		case ClaimPending, ClaimParked:
			return ClaimBlocked, effectsStrayBlock, nil
		}
		return s, effectsStray, nil
	}
	if !s.Unsettled() {
		if in.Answer == AnswerCharged && (s == ClaimBlocked || s == ClaimCharged) {
			return ClaimCharged, effectsCharged, nil
		}
		return s, nil, nil
	}
	switch in.Answer {
	case AnswerNone:
		switch {
		case in.Park && in.Actor != ActorCompleter:
			return ClaimParked, effectsPark, nil
		case in.Paused:
			return s, nil, ErrPaused
		case in.BlockAfter > 0 && in.Age > in.BlockAfter:
			return ClaimBlocked, effectsBlock, nil
		}
		return s, effectsSend, nil
	case AnswerCharged:
		return ClaimCharged, effectsCharged, nil
	case AnswerConflict:
		return ClaimBlocked, effectsBlock, nil
	case AnswerRefused:
		switch {
		case in.Actor == ActorCompleter:
			return ClaimBlocked, effectsBlock, nil
		case in.Actor == ActorCreator && !in.UnknownSeen && !in.OthersSent:
			return ClaimReleased, effectsRelease, nil
		}
	case AnswerUnknown:
		if in.Actor == ActorCompleter {
			return s, effectsUnknown, nil
		}
	}
	return s, nil, nil
}

// operatorNext is the operator's part of Next: only a blocked claim may
// be released, and only when the operator states that the provider holds
// no charge for its key and no stray charge is recorded for the order (the
// provider holds money for it: a release would let another event charge
// it again; mark it charged instead); a pending, parked or blocked claim
// may be marked charged, with the provider's charge id. Both refuse while
// a request may be in flight (Window, SPEC §11 I5), with an
// *InFlightError saying from when the move is allowed. Every refusal
// wraps ErrUnsafe; an allowed move is audited.
func (s ClaimState) operatorNext(m OperatorMove) (ClaimState, []Effect, error) {
	var next ClaimState
	var effects []Effect
	switch m.Action {
	case ActionRelease:
		switch {
		case s != ClaimBlocked:
			return s, nil, fmt.Errorf("%w: only a blocked claim may be released; this one is %s", ErrUnsafe, s.column())
		case !m.ProviderHoldsNoCharge:
			return s, nil, fmt.Errorf("%w: a release needs --provider-holds-no-charge, stating that the provider holds no charge for this claim's idempotency key", ErrUnsafe)
		case m.StrayCharges > 0:
			return s, nil, fmt.Errorf("%w: %d stray charge(s) are recorded for this order (claim show lists them): the provider holds money for it, and a release would let another event charge it again; mark the claim charged instead", ErrUnsafe, m.StrayCharges)
		}
		next, effects = ClaimReleased, effectsOperatorRelease
	case ActionMarkCharged:
		switch {
		case !s.Unsettled() && s != ClaimBlocked:
			return s, nil, fmt.Errorf("%w: only a pending or blocked claim may be marked charged; this one is %s", ErrUnsafe, s.column())
		case strings.TrimSpace(m.ChargeID) == "":
			return s, nil, fmt.Errorf("%w: mark-charged needs the provider's charge id (--charge-id)", ErrUnsafe)
		}
		next, effects = ClaimCharged, effectsOperatorCharged
	default:
		return s, nil, fmt.Errorf("%w: unknown action %q", ErrUnsafe, m.Action)
	}
	if err := m.Window.refusal(); err != nil {
		return s, nil, err
	}
	return next, effects, nil
}
