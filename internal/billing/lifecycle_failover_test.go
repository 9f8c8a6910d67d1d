package billing

import (
	"fmt"
	"strings"

	"github.com/billing-consumer/billing-consumer/internal/modelcheck"
)

// The failover part of the lifecycle model (issue 30, SPEC §9's failover
// paragraph): the database has an asynchronous standby, a failover makes
// the standby the database and loses what it had not received yet, and
// the heal re-decides what was lost before anything is billed again.
//
// Which part of the world is whose:
//   - The database (durable, copied by the standby): the claim row (its
//     status, parked flag, sends recorded — othersSent and the in-flight
//     window —, age, stray records; its token is the database's but no
//     attempt carries it after a failover, which kills every process), the
//     deferred rows, dead_letter's decisions, the pause row, and the
//     position: decided[i], the database's position covers event i's
//     record. (A charge's processed_event row goes with the claim's
//     'charged', which the model keeps.)
//   - Kafka: the committed offsets, the records and their replay counts,
//     the dead letters written to the DLQ topic (dlq). A duplicate_order
//     writes no row (the kept outcome is its log line and its commit): a
//     failover does not erase it, and I2 holds it against what follows.
//   - The provider: the stored result per key, the requests it has not
//     processed yet (orphans).
//   - The processes: the attempts, the completer's send, the claim's holds.
//
// The assumptions the failover adds to the model's (lifecycle_model_test.go):
//   - The standby receives the database's commits in order and may lag
//     behind them by any amount: "the standby catches up" copies the
//     whole durable state at any moment, and a failover makes the last
//     copy the database. One failover at most (failoverM.left).
//   - A failover kills every process (a crash of every replica): their
//     requests stay at the provider. The model's bound on abandoned
//     requests (maxOrphans) bounds it like a crash.
//   - A failover loses the in-flight windows that the lost writes
//     recorded: every request at the provider under a key whose window
//     was written since the standby's copy is unrecorded from then on
//     (more than is lost, never less: the copy may hold an earlier one).
//   - A record's decision, its position and its offset commit are one
//     step (the position is written before the commit, the decision before
//     the position): the model never has a commit without a position.
//   - The frontier (kafkagroup.Mark) is not modelled: every record not
//     committed may have been decided by the old primary, so the heal
//     takes every record whose decision the database does not hold into
//     its ranges, and blocks at least the orders production blocks.
//   - The heal runs right after the failover, before any billing step (the
//     first connection checks before it is used); its gate holds the
//     completer and the deciding loop until every record in its ranges is
//     committed again (decided: charged, deferred, dead-lettered...).
//   - The operator acts only after the failover (a bound: see
//     failoverRulesWith).
//   - The main check (TestLifecycleFailover) assumes that the heal sees
//     every loss: proofAnyLoss, any durable write or in-flight window
//     lost. Production proves a loss only from a committed record whose
//     decision the database lost (proofKafkaAhead); a loss of decisions
//     not committed to Kafka yet is not seen, and can charge an order
//     twice: TestFailoverHealLimit keeps that counterexample.
//   - The heal the main check proves has four additions to the heal as
//     first built (e19103d: failoverRulesWith(name, true, proofKafkaAhead)): on a loss it writes an in-flight window on
//     every unsettled claim (window), the runbook marks its claim charged
//     in the charged event's name (namesCharged), it restores the
//     dead-letter decisions the database lost from the DLQ topic
//     (restores), and it blocks an order with two or more events
//     in its ranges unless its surviving claim is charged
//     (blocksSurviving). TestFailoverHealNeedsEachAddition and
//     TestLifecycleFailoverWide show what each one keeps.

// healProof is when the heal takes a failover's loss as proven.
type healProof int8

const (
	// proofKafkaAhead: a committed record whose decision the database
	// lost (production: a marked commit ahead of the position).
	proofKafkaAhead healProof = iota
	// proofAnyLoss: the failover lost any durable write (the assumption
	// of the main check).
	proofAnyLoss
	// proofEveryFailover: every failover is healed, lost or not (a
	// service that can tell a failover happened, for instance from the
	// timeline, without telling what it lost).
	proofEveryFailover
)

// dbEventM is event i's part of the database.
type dbEventM struct {
	deferred, deferredRec int8
	decision              uint8
	decidedAt             int8
	decided               bool
}

// dbM is the database's durable state: what the standby copies.
type dbM struct {
	claim  claimM
	ev     [maxEvents]dbEventM
	paused bool
}

// failoverM is the failover's part of the world; zero in every scenario
// without one.
type failoverM struct {
	left    int8 // failovers still possible
	standby dbM  // the standby's copy
	// decided[i]: the database's position covers event i's current record
	// (kept only while a failover is possible).
	decided [maxEvents]bool
	// unsynced[k]: an in-flight window for key k was written since the
	// standby's copy (a claim's insert, markSent, the completer's re-send).
	unsynced [maxEvents]bool
	heal     bool // a failover happened and the heal has not run yet
	lost     bool // that failover lost a durable write
	gate     bool // the heal's gate is up
	// rng: the events the heal re-decides (their records are in its ranges).
	rng [maxEvents]bool
	// healClaim: the claim is the heal's blocked claim (claimed_by
	// 'failover heal'), whose runbook looks every key up.
	healClaim bool
}

// durable is w's database.
func durable(w world) dbM {
	db := dbM{claim: w.claim, paused: w.paused}
	db.claim.creator, db.claim.held = 0, 0
	for i := range w.n {
		e := w.ev[i]
		db.ev[i] = dbEventM{deferred: e.deferred, deferredRec: e.deferredRec, decision: e.decision, decidedAt: e.decidedAt,
			decided: w.fo.decided[i]}
	}
	return db
}

// restore makes db w's database.
func restore(w *world, db dbM) {
	w.claim, w.paused = db.claim, db.paused
	for i := range w.n {
		d, e := db.ev[i], &w.ev[i]
		e.deferred, e.deferredRec, e.decision, e.decidedAt = d.deferred, d.deferredRec, d.decision, d.decidedAt
		w.fo.decided[i] = d.decided
	}
	w.normalize()
}

// failoverRules are the model's rules with a standby, a failover and the
// heal.
type failoverRules struct {
	modelRules
	heal  bool // the heal runs after a failover
	proof healProof
	// window: on a loss, the heal writes an in-flight window on every
	// unsettled claim, its blocked claims included, that covers every
	// request sent before the heal (in_flight_until = greatest(it, now() +
	// the longest sender deadline)): the operator's commands then wait for
	// the requests whose windows the failover lost; a claim inserted later
	// records a later window anyway.
	window bool
	// namesCharged: the runbook marks the heal's claim charged in the name
	// of the event whose key the provider charged (not the claim's first
	// event).
	namesCharged bool
	// restores is which dead_letter decisions the heal restores from the
	// dead letters in the DLQ topic.
	restores decisionsRestored
	// blocksSurviving: an order with two or more events in the ranges is
	// blocked, with the heal's runbook, when its surviving claim is not
	// charged and two or more of them wait behind it (not only when no
	// claim survived): a surviving pending or blocked claim may be one the
	// lost history released before another event's key was charged.
	blocksSurviving bool
}

// decisionsRestored is which lost dead_letter decisions the heal
// restores from the DLQ topic.
type decisionsRestored int8

const (
	restoreNone decisionsRestored = iota
	// restoreRanges: those of the records it re-decides.
	restoreRanges
	// restoreAll: every event with a dead letter and no decision (a
	// redelivered record's dead letter is a decision no position covers).
	restoreAll
)

// failoverRulesWith are productionRules with the standby and the
// failover, the heal as heal and proof say. The operator acts only after
// the failover: a bound on the scenarios (it keeps the exploration some
// thirty times smaller), and what the runbook asks of an operator whose
// commands the failover lost, who re-issues them (docs/operations.md,
// "After a failover"). An operator's command on the heal's claim waits
// for every key's recorded requests: its window is the order's row.
func failoverRulesWith(name string, heal bool, proof healProof) failoverRules {
	r := productionRules()
	r.name = name
	may := r.operatorMay
	r.operatorMay = func(w world) bool {
		if w.fo.left > 0 {
			return false
		}
		if w.fo.healClaim {
			for i := range w.n {
				if w.inFlight(i, true) {
					return false
				}
			}
		}
		return may(w)
	}
	return failoverRules{modelRules: r, heal: heal, proof: proof}
}

// healChecked is the heal the main check proves: the heal as first built
// with its four additions (window, namesCharged, restores, blocksSurviving), under
// the assumption that every loss is proven (proofAnyLoss). Production has
// two of them, window (postgres.windowSQL) and blocksSurviving
// (postgres.holds); namesCharged (claim mark-charged naming the event
// whose key was charged) and restores (the lost dead_letter decisions
// restored from the DLQ topic) are not built: without them the model
// finds I2 violations, a trace that names the wrong event or a second
// dead-letter reason, never a second charge (TestFailoverHealNeedsEachAddition).
func healChecked() failoverRules {
	f := failoverRulesWith("the heal with its additions", true, proofAnyLoss)
	f.window, f.namesCharged, f.restores, f.blocksSurviving = true, true, restoreAll, true
	return f
}

// steps is the model's transition relation with the failover's steps:
// the heal alone (and the provider) right after a failover; otherwise
// every step of the model, the standby catching up and the failover.
func (f failoverRules) steps(w world) []modelcheck.Step[world] {
	s := &stepper{r: f.modelRules, from: w}
	if w.fo.heal {
		s.provider()
		f.healStep(s)
	} else {
		s.out = f.modelRules.steps(w)
		if w.fo.left > 0 {
			if db := durable(w); db != w.fo.standby {
				n := w
				n.fo.standby, n.fo.unsynced = db, [maxEvents]bool{}
				s.add("the standby catches up", n)
			}
			if n, ok := f.failedOver(w); ok {
				s.add("failover onto the standby: every process dies, the database is the standby's copy", n)
			}
		}
	}
	for k := range s.out {
		f.track(w, &s.out[k].To)
	}
	return s.out
}

// track keeps the failover's part of a step's result in step with the
// rest: a record committed is covered by the position, a replayed one is
// a new record no position covers yet; the gate lifts once every record in
// its ranges is committed; the heal's claim marked charged names the
// charged event if the runbook says so; the heal's claim is gone once it
// is no longer blocked.
func (f failoverRules) track(from world, to *world) {
	if to.fo.left > 0 {
		windows(from, to)
	}
	for i := range to.n {
		if to.fo.left > 0 && !from.ev[i].committed && to.ev[i].committed {
			to.fo.decided[i] = true
		}
		if to.ev[i].replays != from.ev[i].replays {
			to.fo.decided[i], to.fo.standby.ev[i].decided = false, false
		}
	}
	if to.fo.gate {
		done := true
		for i := range to.n {
			done = done && (!to.fo.rng[i] || to.ev[i].committed)
		}
		if done {
			to.fo.gate, to.fo.rng = false, [maxEvents]bool{}
		}
	}
	if from.fo.healClaim && to.claim.status == mCharged && from.claim.status == mBlocked && f.namesCharged {
		for i := range to.n {
			if to.keys[i].a() == AnswerCharged {
				to.claim.owner = i
				break
			}
		}
	}
	if !to.claim.exists || to.claim.status != mBlocked {
		to.fo.healClaim = false
	}
}

// windows marks the keys whose in-flight window the step from -> to
// wrote: a claim inserted by an attempt (its first send's), a send that
// is not the creator's first (markSent), the completer's re-send.
func windows(from world, to *world) {
	if !from.claim.exists && to.claim.exists && to.claim.creator != 0 {
		to.fo.unsynced[to.claim.owner] = true
	}
	for i := range to.n {
		for by, a := range from.ev[i].att {
			if a.pc == pcSend && to.ev[i].att[by].pc == pcAwait && (!a.created || a.unknown) {
				to.fo.unsynced[i] = true
			}
		}
	}
	if !from.comp.busy && to.comp.busy {
		to.fo.unsynced[to.comp.key] = true
	}
}

// failedOver is w after a failover: every process crashed (as crashAll),
// the database the standby's copy, and, if a write was lost, every
// request at the provider unrecorded; false when the model's bound on
// abandoned requests allows no crash.
func (f failoverRules) failedOver(w world) (world, bool) {
	n, ok := crashAll(w)
	if !ok {
		return w, false
	}
	n.fo.lost = durable(n) != n.fo.standby || n.fo.unsynced != [maxEvents]bool{}
	restore(&n, n.fo.standby)
	for i := range n.n {
		if o := &n.ev[i].orphans; n.fo.unsynced[i] {
			o[0], o[1] = min(o[0]+o[1], maxOrphans), 0
		}
	}
	n.fo.unsynced = [maxEvents]bool{}
	n.fo.left--
	n.fo.heal = f.heal
	if n.fo.left == 0 {
		n.fo.standby = dbM{}
		if !f.heal {
			n.fo.decided, n.fo.lost = [maxEvents]bool{}, false
		}
	}
	return n, true
}

// proven is whether the heal sees a loss in w, right after the failover.
func (f failoverRules) proven(w world) bool {
	switch f.proof {
	case proofAnyLoss:
		return w.fo.lost
	case proofEveryFailover:
		return true
	}
	for i := range w.n {
		if w.ev[i].committed && !w.fo.decided[i] {
			return true
		}
	}
	return false
}

// healStep is the heal (internal/heal): on a proven loss, every record
// whose decision the database does not hold is un-committed (re-read and
// re-decided), the gate holds the billing loops until they are committed
// again, and an order with two or more of them and no surviving claim gets
// a blocked claim, no send recorded, in its first event's name.
func (f failoverRules) healStep(s *stepper) {
	n := s.from
	n.fo.heal = false
	label := "the heal finds no loss"
	if f.proven(n) {
		var count int8
		first := int8(-1)
		for i := range n.n {
			if n.fo.decided[i] {
				continue
			}
			n.fo.rng[i], n.ev[i].committed = true, false
			count++
			if first < 0 {
				first = i
			}
		}
		n.fo.gate = count > 0
		for i := range n.n {
			if e := &n.ev[i]; (f.restores == restoreAll || f.restores == restoreRanges && n.fo.rng[i]) && e.dlq != 0 && e.decision == 0 {
				e.decision, e.decidedAt = e.dlq, e.replays
			}
		}
		if f.window {
			// Every request at the provider was sent before the heal: the
			// window it writes covers them all, whatever their key.
			for i := range n.n {
				o := &n.ev[i].orphans
				o[1], o[0] = min(o[0]+o[1], maxOrphans), 0
			}
		}
		label = fmt.Sprintf("the heal re-decides %d record(s), gate up", count)
		switch {
		case count < 2:
		case !n.claim.exists:
			n.claim = claimM{exists: true, owner: first, status: mBlocked}
			n.fo.healClaim = true
			label += ", blocks the order in " + eventNames[first] + "'s name"
		case f.blocksSurviving && n.claim.status != mCharged && waitersOf(n) >= 2:
			n.claim.status, n.fo.healClaim = mBlocked, true
			label += ", blocks " + eventNames[n.claim.owner] + "'s surviving claim"
		}
	}
	n.fo.lost = false
	if n.fo.left == 0 {
		n.fo.decided = [maxEvents]bool{}
	}
	s.add(label, n)
}

// operatorCharged is what the runbook finds at the provider for claim c:
// its own key charged or a stray recorded; for the heal's claim, any key
// of the order charged (its runbook looks every event's key up).
func (w *world) operatorCharged() bool {
	c := w.claim
	if w.fo.healClaim {
		return w.chargedKeys() > 0
	}
	return w.keys[c.owner].a() == AnswerCharged || c.strays > 0
}

// operatorRaces is whether an operator's decision on the claim races a
// request: one for its key at the provider, or for any key of the order
// when the claim is the heal's.
func (w *world) operatorRaces() bool {
	if w.fo.healClaim {
		for i := range w.n {
			if w.inFlight(i, false) {
				return true
			}
		}
		return false
	}
	return w.inFlight(w.claim.owner, false)
}

// showFailover renders a state with its failover part.
func (w world) showFailover() string {
	var b strings.Builder
	b.WriteString(w.show())
	f := w.fo
	fmt.Fprintf(&b, "\n    failover: left=%d heal=%v gate=%v rng=%v healClaim=%v decided=%v", f.left, f.heal, f.gate, f.rng[:w.n], f.healClaim, f.decided[:w.n])
	return b.String()
}

// waitersOf counts the re-decided events other than the claim's owner:
// production (internal/postgres.holds) blocks a surviving pending claim
// only with two or more of them, since with one the order after the
// claim is the only one there is. TestLifecycleFailoverWide's three
// events, two amounts, holds with that rule (1,788,490 states).
func waitersOf(n world) int {
	c := 0
	for i := range n.n {
		if n.fo.rng[i] && i != n.claim.owner {
			c++
		}
	}
	return c
}
