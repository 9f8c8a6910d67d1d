package billing

import (
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// ClaimStatus is the state of an order's claim in the charge ledger: the
// charge.status column, or ClaimReleased for a deleted row. It is the one
// state machine of the money path; NextClaimStatus is its only transition
// function, used by the charge path, the completer and reconcile alike.
type ClaimStatus string

const (
	// ClaimPending: the order is claimed by its event (event_id, and the
	// claim_token of the attempt that created it); the outcome of its
	// charge is not known yet. Only requests of that event (same key, same
	// body) are ever sent for it. Moved by the creating attempt (to
	// charged, released or blocked), by any other sender of the request —
	// a redelivery of the event, the completer, reconcile — (to charged or
	// blocked), or by an operator.
	ClaimPending ClaimStatus = "pending"
	// ClaimCharged: the provider took the charge; provider_charge_id holds
	// its id. Final.
	ClaimCharged ClaimStatus = "charged"
	// ClaimBlocked: the provider answered 422, a sender other than the
	// creator was refused, or the outcome stayed unknown past
	// BILLING_CLAIM_BLOCK_AFTER (the provider may have forgotten the key).
	// An operator decides; never released automatically. A 2xx for its key
	// still marks it charged: that answer is the truth about the money.
	ClaimBlocked ClaimStatus = "blocked"
	// ClaimReleased: the row was deleted, and the order is free for another
	// event. Only the creating attempt moves a claim here, on a definite
	// refusal, while none of its requests had an unknown outcome and no
	// other attempt has recorded that it sent (charge.others_sent_at): then
	// no request for the claim can have taken money.
	ClaimReleased ClaimStatus = "released"
)

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

// Actor is who acts on a claim.
type Actor int

const (
	// ActorCreator is the attempt whose claim_token the claim carries: one
	// delivery's processing, its retries included (WithAttempt).
	ActorCreator Actor = iota
	// ActorEvent is another attempt of the claim's event: a redelivery, or
	// the same delivery on another replica.
	ActorEvent
	// ActorCompleter is the completer of a running service or reconcile.
	ActorCompleter
)

// ClaimFacts are what a pending claim's next state depends on.
type ClaimFacts struct {
	Answer Answer
	Actor  Actor
	// OthersSent: an attempt other than the creator has recorded that it
	// sends the claim's request (charge.others_sent_at is set). The release
	// statement evaluates it again on the row itself, so a sender that
	// records meanwhile is never missed.
	OthersSent bool
	// UnknownSeen: one of the actor's own requests for the claim had an
	// unknown outcome.
	UnknownSeen bool
	// Age is the claim's age; BlockAfter is BILLING_CLAIM_BLOCK_AFTER, 0
	// for no limit.
	Age, BlockAfter time.Duration
}

// NextClaimStatus is the state a pending claim moves to, by facts; for
// AnswerNone, ClaimPending means "send the request". The whole table:
//
//	answer         creator (nothing unknown,   creator otherwise,   completer,
//	               no other sender)            other event attempt  reconcile
//	none           send                        send                 send
//	none, age >    blocked (not sent)          blocked              blocked
//	  block-after
//	2xx            charged                     charged              charged
//	422, invalid   blocked                     blocked              blocked
//	refused        released                    pending              blocked
//	unknown        pending                     pending              pending
//
// A refused request of an event's attempt that may not release the claim
// leaves it pending for the completer, whose re-send either gets the
// provider's stored answer or, refused too, blocks the claim for an
// operator. A systemic answer (credentials, a redirect) is the caller's to
// handle before this: it is no news about the claim.
func NextClaimStatus(f ClaimFacts) ClaimStatus {
	switch f.Answer {
	case AnswerNone:
		if f.BlockAfter > 0 && f.Age > f.BlockAfter {
			return ClaimBlocked
		}
		return ClaimPending
	case AnswerCharged:
		return ClaimCharged
	case AnswerConflict:
		return ClaimBlocked
	case AnswerRefused:
		switch {
		case f.Actor == ActorCompleter:
			return ClaimBlocked
		case f.Actor == ActorCreator && !f.UnknownSeen && !f.OthersSent:
			return ClaimReleased
		}
	}
	return ClaimPending
}

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

// NextStrayStatus is the 2xx rule (SPEC §11): the state the order's ledger
// row moves to when a 2xx arrives for an event whose claim is gone or is
// another event's (a foreign binary, a manual DELETE, a provider that
// finished a request past its bound). current is that row's status,
// ClaimReleased when the order has none. The 2xx is the truth about the
// money, so it is never dropped: recorded as a stray charge in every case,
//
//	no row (released)   charged: the event's own claim, inserted
//	pending (another's) blocked: an operator decides with both charges
//	                    in view (its own request may still be in flight)
//	charged, blocked    unchanged: two charges, or one already with an
//	                    operator; logged at ERROR, shown by claim show
//
// and the event's outcome is charged.
func NextStrayStatus(current ClaimStatus) ClaimStatus {
	switch current {
	case ClaimReleased:
		return ClaimCharged
	case ClaimPending:
		return ClaimBlocked
	}
	return current
}
