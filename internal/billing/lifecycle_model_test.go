package billing

import (
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/modelcheck"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// The lifecycle model: one order, two or three events for it (the same
// customer and amount under other keys, or another amount), every
// delivery and redelivery, the per-event path (the batched path runs the
// same statements for several orders at once; for one order it is the
// same sequence), parking and deferral, the completer and the deciding
// loop, the operator following the runbooks, pause and resume, a crash
// after any step, and every provider answer. Each step is one
// statement's effect or one message; where a step decides, it calls the
// rules (lifecycle_rules_test.go), which call the production's own
// transition functions. The assumptions about the provider and Kafka are
// written out below, in one place.
//
// SPEC §11's invariants are checked in every reachable state, each on its
// own (lifecycleInvariants).

// The model's assumptions: what it takes for granted about the world
// around the service. A change in any of them changes what the model
// proves.
//
//   - Kafka redelivers a record until its offset commit lands; a commit
//     may be lost (rebalance, offset reset) and the record delivered again
//     (bounded by budget.redeliver). A dead letter can be replayed
//     (budget.replay): the record is delivered again. After a replay the
//     original record may still be delivered late (budget.late: its
//     commit lost, an offset reset), beside or after the replayed one.
//   - The provider keeps one result per idempotency key: the first request
//     it processes under a key takes the charge (2xx) or refuses it (402);
//     every later request under that key gets that stored result. It may
//     also fail a request without processing it (5xx: nothing stored). A
//     request it has received is processed or dropped within the provider
//     bound after the sender's deadline: so a request whose send was
//     recorded (in_flight_until) cannot be processed after the database's
//     in-flight window has closed. An unrecorded request gives no such
//     promise: it may be processed at any later moment.
//   - The client may give up on a request at any time (timeout): the
//     request may still be processed afterwards, and its answer is lost.
//   - A crash loses every process's local state (attempts, the completer's
//     send in progress); the database and Kafka keep theirs; requests
//     already sent stay at the provider.
//   - Ages are the database's: a claim becomes older than block-after at
//     some moment (a step), never younger.
//   - A failover of the database onto an asynchronous standby, and the
//     heal after it, are lifecycle_failover_test.go's, with their own
//     assumptions (among them: the heal sees every loss).
//   - The operator follows the runbooks: a blocked claim is marked charged
//     when the provider holds a charge for its key, released (stating the
//     provider holds none) otherwise; a conflict's dead letter goes to the
//     order service; a permanent or exhausted one may be replayed.

const maxEvents = 3

// maxOrphans bounds the requests per key and kind whose senders gave up
// while the provider had not processed them yet.
const maxOrphans = 1

// Where an attempt is in Process, for the model.
const (
	pcIdle  int8 = iota
	pcClaim      // the next step is the claim (a Process call)
	pcSend       // claimed: record the send, then send
	pcAwait      // its request is in flight
)

// Who an attempt is: the consumer's processing of a delivery, or the
// deciding loop's of a deferred row.
const (
	byConsumer int8 = iota
	byDecider
	bySenders
)

// requestM is the request a sender waits for.
type requestM struct {
	recorded  bool // its send was recorded (in_flight_until) before it left
	processed bool // the provider has answered; the answer is on its way
	answer    manswer
}

// attemptM is one attempt at an event (a delivery's processing, its
// retries included, or one deferred decision).
type attemptM struct {
	pc      int8
	created bool // this attempt created the claim it sends
	unknown bool // one of its requests had an unknown outcome
	// stale: the attempt decides the event's original record (count 0),
	// delivered late after a replay, not its current one.
	stale bool
	req   requestM
}

// manswer is an Answer in a byte, for the same reason as mstatus.
type manswer int8

func (m manswer) a() Answer { return Answer(m) }

// mstatus is a claim's status in the model: a byte, not ClaimState's
// string, so that a world holds no pointer and the explorer's millions of
// states cost the garbage collector nothing to scan.
type mstatus int8

const (
	mPending mstatus = iota
	mBlocked
	mCharged
)

func (m mstatus) claim() ClaimState {
	return [...]ClaimState{ClaimPending, ClaimBlocked, ClaimCharged}[m]
}

// mstatusOf is s's status column: mPending for a parked claim.
func mstatusOf(s ClaimState) mstatus {
	switch s {
	case ClaimBlocked:
		return mBlocked
	case ClaimCharged:
		return mCharged
	}
	return mPending
}

// state is c's state as production derives it (ClaimStateOf): parked
// for a pending claim that is parked.
func (c claimM) state() ClaimState {
	return ClaimStateOf(string(c.status.claim()), c.parked)
}

// claimM is the order's row in the charge ledger.
type claimM struct {
	exists bool
	owner  int8 // event index
	// creator is the running attempt that created the claim (byX + 1),
	// 0 once it has ended: a claim token no running attempt carries.
	creator    int8
	status     mstatus
	parked     bool
	othersSent bool
	old        bool // older than block-after
	held       int8 // FOR KEY SHARE holds of senders' transactions
	strays     int8 // 2xx recorded for other keys (the 2xx rule)
}

// eventM is one event's record and its durable traces.
type eventM struct {
	amount    int8 // 0 or 1: events with the same amount are duplicates of one order
	committed bool // the record's offset is committed
	att       [bySenders]attemptM
	deferred  int8 // 0: no deferred row; else its place in the order of deferrals
	dlq       uint8
	outcomes  uint8
	// orphans counts this key's requests whose senders gave up before the
	// provider processed them, unrecorded [0] and recorded [1].
	orphans [2]int8
	// replays is the dlq-replay-count of the event's record (how often its
	// dead letter was replayed), deferredRec that of the record its
	// deferred row keeps.
	replays, deferredRec int8
	// decision is the dead letter recorded in dead_letter (a dlq bit, 0:
	// none; decisionSpent: a replay's claim spent it) for a record of
	// count decidedAt (migration 00012).
	decision  uint8
	decidedAt int8
	// spentCopy: a copy of the dead letter that was replayed was written
	// after the replay had decided the event.
	spentCopy bool
}

// Dead-letter reasons and committed outcomes, as bits.
const (
	dlqConflict uint8 = 1 << iota
	dlqPermanent
	dlqExhausted
)

// decisionSpent is a dead_letter row whose reason is ReplayedReason: a
// record replayed decidedAt times was claimed since the decision.
const decisionSpent uint8 = 1 << 7

// The outcomes a record is committed with. Only duplicate_order is kept
// in the state (I2 asks whether it was true); the others are labels.
const (
	outCharged uint8 = 1 << iota
	outDuplicate
	outDuplicateOrder
	outParked
	outDeferred
	keptOutcomes = outDuplicateOrder
)

// completerM is the completer's send in progress (one at a time: the
// advisory lock).
type completerM struct {
	busy bool
	key  int8
	req  requestM
}

// budgetM bounds the environment's moves.
type budgetM struct {
	redeliver, replay, crash, pause int8
	// late: deliveries of the original record of a replayed event (the
	// first event's only).
	late int8
}

// world is the whole state. It is comparable: the explorer hashes it.
type world struct {
	n         int8
	ev        [maxEvents]eventM
	claim     claimM
	keys      [maxEvents]manswer // the provider's stored result per key (AnswerNone: none)
	comp      completerM
	paused    bool
	budget    budgetM
	sentPause bool      // a request left while paused (I4)
	raced     bool      // an operator decided while a request for the claim was in flight (I5)
	fo        failoverM // the standby, a failover and the heal (lifecycle_failover_test.go)
}

// normalize ranks the deferred rows 1..k, so that states that differ only
// in how many rows came and went are one state.
func (w *world) normalize() {
	old := w.ev // the ranks are counted on the places before any moves
	for i := range w.n {
		if old[i].deferred == 0 {
			continue
		}
		rank := int8(1)
		for j := range w.n {
			if old[j].deferred != 0 && old[j].deferred < old[i].deferred {
				rank++
			}
		}
		w.ev[i].deferred = rank
	}
}

// lastDeferred is the place of the latest deferred row.
func (w *world) lastDeferred() int8 {
	var m int8
	for i := range w.n {
		m = max(m, w.ev[i].deferred)
	}
	return m
}

// modelEvent is event i as the production sees it.
func (w *world) modelEvent(i int8) events.OrderConfirmed {
	amount, _ := money.ParseAmount("10.00")
	if w.ev[i].amount != 0 {
		amount, _ = money.ParseAmount("12.50")
	}
	return events.OrderConfirmed{EventID: modelID(i), OrderID: 1, CustomerID: 7, TotalAmount: amount}
}

func modelID(i int8) uuid.UUID { return uuid.UUID{0x01, 0x9f, 15: byte(i + 1)} }

// modelToken is the claim token of attempt by of event i, or of no
// running attempt (by < 0).
func modelToken(i, by int8) uuid.UUID { return uuid.UUID{0x0a, byte(i), 15: byte(by + 1)} }

// modelBlockAfter and modelOld are the ages of the model's two clocks.
const (
	modelBlockAfter = time.Hour
	modelOld        = 2 * time.Hour
	modelYoung      = time.Minute
)

// row is the claim as the production reads it.
func (w *world) row() (Claim, bool) {
	c := w.claim
	if !c.exists {
		return Claim{}, false
	}
	ev := w.modelEvent(c.owner)
	age := modelAgeOf(c)
	return Claim{OrderID: 1, EventID: ev.EventID, CustomerID: ev.CustomerID, Amount: ev.TotalAmount, Status: c.state(),
		Age: age, Attempt: modelToken(c.owner, c.creator-1)}, true
}

// chargedKeys counts the keys of the order the provider charged.
func (w *world) chargedKeys() int {
	n := 0
	for i := range w.n {
		if w.keys[i].a() == AnswerCharged {
			n++
		}
	}
	return n
}

// inFlight reports whether a request for key is at the provider, not yet
// processed; recordedOnly counts only those whose send was recorded.
func (w *world) inFlight(key int8, recordedOnly bool) bool {
	open := func(r requestM) bool { return !r.processed && (r.recorded || !recordedOnly) }
	e := w.ev[key]
	for _, a := range e.att {
		if a.pc == pcAwait && open(a.req) {
			return true
		}
	}
	if w.comp.busy && w.comp.key == key && open(w.comp.req) {
		return true
	}
	return e.orphans[1] > 0 || !recordedOnly && e.orphans[0] > 0
}

// recordedUnsent reports whether an attempt of key has its first send
// recorded by the claim's insert but not sent yet (its deadline runs).
func (w *world) recordedUnsent(key int8) bool {
	for _, a := range w.ev[key].att {
		if a.pc == pcSend && a.created && !a.unknown {
			return true
		}
	}
	return false
}

// show renders a state for a counterexample.
func (w world) show() string {
	var b strings.Builder
	names := "abc"
	fmt.Fprintf(&b, "paused=%v", w.paused)
	if w.claim.exists {
		c := w.claim
		fmt.Fprintf(&b, " claim{%c %s creator=%d parked=%v othersSent=%v old=%v held=%d strays=%d}", names[c.owner], c.status.claim(), c.creator, c.parked, c.othersSent, c.old, c.held, c.strays)
	} else {
		b.WriteString(" claim{none}")
	}
	for i := range w.n {
		e := w.ev[i]
		fmt.Fprintf(&b, "\n    %c: amount#%d committed=%v deferred=%d dlq=%03b outcomes=%05b provider=%s replays=%d", names[i], e.amount, e.committed,
			e.deferred, e.dlq, e.outcomes, answerName(w.keys[i].a()), e.replays)
		if e.decision != 0 {
			fmt.Fprintf(&b, " decision{dlq=%03b replays=%d}", e.decision, e.decidedAt)
		}
	}
	for i := range w.n {
		for by, a := range w.ev[i].att {
			if a.pc != pcIdle {
				fmt.Fprintf(&b, "\n    %c's attempt %d: pc=%d created=%v unknown=%v request=%+v", names[i], by, a.pc, a.created, a.unknown, a.req)
			}
		}
		if o := w.ev[i].orphans; o != [2]int8{} {
			fmt.Fprintf(&b, "\n    %c's abandoned requests: %d unrecorded, %d recorded", names[i], o[0], o[1])
		}
	}
	if w.comp.busy {
		fmt.Fprintf(&b, "\n    completer sending %c: %+v", names[w.comp.key], w.comp.req)
	}
	return b.String()
}

func answerName(a Answer) string {
	return [...]string{"none", "charged", "refused", "conflict", "unknown"}[a]
}

// lifecycleInvariants are SPEC §11's I1–I5 over the model.
func lifecycleInvariants() []modelcheck.Invariant[world] {
	return []modelcheck.Invariant[world]{
		{Name: "I1 once", Holds: func(w world) bool { return w.chargedKeys() <= 1 }},
		{Name: "I2 one true decision", Holds: oneTrueDecision},
		{Name: "I2 one reason", Holds: oneReason},
		{Name: "I2 one decision", Holds: oneDecision},
		{Name: "I3 a path to the charge", Holds: pathToCharge},
		{Name: "I4 pause means pause", Holds: func(w world) bool { return !w.sentPause }},
		{Name: "I5 no decision races a request", Holds: func(w world) bool { return !w.raced }},
	}
}

// oneTrueDecision: never a conflict (nor a duplicate_order) for an event
// whose own key was charged.
func oneTrueDecision(w world) bool {
	for i := range w.n {
		e := w.ev[i]
		if w.keys[i].a() == AnswerCharged && (e.dlq&dlqConflict != 0 || e.outcomes&outDuplicateOrder != 0) {
			return false
		}
	}
	return true
}

// oneReason: the dead letters of an event (since its last replay) carry
// one reason.
func oneReason(w world) bool {
	for i := range w.n {
		if bits.OnesCount8(w.ev[i].dlq) > 1 {
			return false
		}
	}
	return true
}

// oneDecision: a replayed event's trace never goes back to the dead
// letter that was replayed once the replay decided it (a dead letter or
// duplicate_order): the old decision would then stand beside the new.
func oneDecision(w world) bool {
	for i := range w.n {
		if w.ev[i].spentCopy {
			return false
		}
	}
	return true
}

// pathToCharge: while the provider holds no charge for the order, every
// event is held durably by its uncommitted record, its own pending claim,
// a deferred row or a replayable dead letter.
func pathToCharge(w world) bool {
	if w.chargedKeys() > 0 {
		return true
	}
	for i := range w.n {
		e := w.ev[i]
		held := !e.committed || e.deferred != 0 || e.dlq&(dlqPermanent|dlqExhausted) != 0 ||
			w.claim.exists && w.claim.owner == i && w.claim.status == mPending
		if !held {
			return false
		}
	}
	return true
}
