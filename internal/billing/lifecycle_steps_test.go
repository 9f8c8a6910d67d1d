package billing

import (
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/modelcheck"
)

// The model's steps. next lists every step out of a state; each step
// copies the world, changes the copy as one statement or message would,
// and asks the rules wherever the service decides.

type stepper struct {
	r    modelRules
	out  []modelcheck.Step[world]
	from world
}

func (s *stepper) add(label string, w world) {
	w.normalize()
	s.out = append(s.out, modelcheck.Step[world]{Label: label, To: w})
}

var eventNames = [maxEvents]string{"a", "b", "c"}

// next is the model's transition relation under rules r.
func (r modelRules) steps(w world) []modelcheck.Step[world] {
	s := &stepper{r: r, from: w}
	for i := range w.n {
		s.deliveries(i)
		for by := range bySenders {
			s.attempt(i, int8(by))
		}
		s.decideDeferred(i)
	}
	s.provider()
	s.completer()
	s.operator()
	s.environment()
	return s.out
}

// deliveries: Kafka hands out an uncommitted record whose event has no
// consumer attempt (after a pause, not while it is in force); a committed
// record's commit is lost; a replayable dead letter is replayed; a
// replayed event's original record is delivered late.
func (s *stepper) deliveries(i int8) {
	w := s.from
	e := w.ev[i]
	if !e.committed && e.att[byConsumer].pc == pcIdle && !w.paused {
		n := w
		n.ev[i].att[byConsumer] = attemptM{pc: pcClaim}
		s.add("deliver "+eventNames[i], n)
	}
	if e.committed && w.budget.redeliver > 0 {
		n := w
		n.budget.redeliver--
		n.ev[i].committed = false
		s.add("commit of "+eventNames[i]+" lost: redelivered", n)
	}
	if e.committed && w.budget.replay > 0 && e.dlq&(dlqPermanent|dlqExhausted) != 0 {
		n := w
		n.budget.replay--
		n.ev[i].committed = false
		// A replayed dead letter is spent (dlq replay counts it replayed):
		// the record is decided again, and only its new dead letters, if
		// any, are its decision.
		n.ev[i].dlq = 0
		n.ev[i].replays++
		s.add("operator replays the dead letter of "+eventNames[i], n)
	}
	// Only the first event's: the events are alike, and the scenario
	// stays bounded.
	if i == 0 && e.replays > 0 && w.budget.late > 0 && e.att[byConsumer].pc == pcIdle && !w.paused {
		n := w
		n.budget.late--
		n.ev[i].att[byConsumer] = attemptM{pc: pcClaim, stale: true}
		s.add("the original record of "+eventNames[i]+" is delivered late", n)
	}
}

// attempt: the next step of event i's attempt by actor by.
func (s *stepper) attempt(i, by int8) {
	a := s.from.ev[i].att[by]
	switch a.pc {
	case pcClaim:
		s.claimStep(i, by)
	case pcSend:
		s.sendStep(i, by)
	case pcAwait:
		s.awaitStep(i, by)
	}
}

// claimStep is a Process call's claim phase: the claim statement, or
// what the existing row means (the rules' decide).
func (s *stepper) claimStep(i, by int8) {
	w := s.from
	if s.r.senderWaitsOnPause(by) && w.paused {
		return
	}
	name := eventNames[i]
	count := recordOf(w, i, by)
	if reason := s.r.decided(w, i, count); reason != 0 {
		if e := w.ev[i]; e.decidedAt < e.replays {
			// A copy of the dead letter that was replayed: part of the
			// trace before the replay when it is written before the
			// replay decided anything, a second decision after (I2).
			w.ev[i].spentCopy = e.dlq != 0 || e.outcomes&keptOutcomes != 0
			s.end(w, i, by, name+" finds the dead letter that was replayed: writes a copy of it")
			return
		}
		s.deadLetter(w, i, by, reason, name+" finds its dead letter decided before: writes it again")
		return
	}
	// The claim statement spends a decision older than the record.
	s.r.spends(&w, i, count)
	if !w.claim.exists {
		if s.r.heldByDeferred(w, i) {
			s.busy(i, by, "claim of "+name+": order held by an earlier deferred event")
			return
		}
		n := w
		n.claim = claimM{exists: true, owner: i, creator: by + 1, status: mPending}
		n.ev[i].att[by].pc, n.ev[i].att[by].created = pcSend, true
		s.add(name+" claims the order", n)
		return
	}
	row, _ := w.row()
	ev := w.modelEvent(i)
	v, outcome, err := s.r.decide(row, true, ev, modelBlockAfter)
	switch v {
	case verdictCharge:
		n := w
		n.ev[i].att[by].pc = pcSend
		n.ev[i].att[by].created = row.Attempt == modelToken(i, by)
		s.add(name+" finds its own pending claim: charge again", n)
	case verdictBlock:
		n := w
		if n.claim.status == mPending {
			n.claim.status = mBlocked
		}
		s.fail(n, i, by, err, name+" finds its own claim past block-after: blocks it")
	case verdictReclaim:
		// No row after all: only when the row vanished between the
		// statements; the model's claim step is atomic.
	default:
		if err == nil {
			s.finish(w, i, by, outcomeBit(outcome), name+" decided "+string(outcome))
			return
		}
		s.fail(w, i, by, err, name+" decided: "+fault.KindOf(err).String())
	}
}

func outcomeBit(o Outcome) uint8 {
	switch o {
	case Charged:
		return outCharged
	case Duplicate:
		return outDuplicate
	default:
		return outDuplicateOrder
	}
}

// sendStep records the send as the rules say and sends the request.
func (s *stepper) sendStep(i, by int8) {
	w := s.from
	a := w.ev[i].att[by]
	name := eventNames[i]
	if s.r.senderWaitsOnPause(by) && w.paused {
		return
	}
	n := w
	// The claim's insert records the creator's first send; every other
	// send recorded goes through markSent, which sends only for a claim
	// still pending.
	first := a.created && !a.unknown
	if !a.created || !first && s.r.recordsSend(true, false) {
		if !ownPending(w.claim, i) {
			n.ev[i].att[by].pc = pcClaim
			s.add(name+": claim moved before the send; decide again", n)
			return
		}
	}
	if !a.created {
		// markSent, then the charge transaction's hold.
		n.claim.othersSent = true
		n.claim.held++
	}
	n.ev[i].att[by].req = requestM{recorded: s.r.recordsSend(a.created, first)}
	n.sentPause = n.sentPause || n.paused
	n.ev[i].att[by].pc = pcAwait
	s.add(name+" sends its request", n)
}

// awaitStep: the answer comes back, or the client gives up (the request
// may then still be processed).
func (s *stepper) awaitStep(i, by int8) {
	w := s.from
	a := w.ev[i].att[by]
	name := eventNames[i]
	n := w
	n.ev[i].att[by].req = requestM{}
	if !a.created {
		n.claim.held--
	}
	if a.req.processed {
		s.answered(n, i, by, a.req.answer.a(), name+" gets "+answerName(a.req.answer.a()))
	} else if !abandon(&n, i, a.req) {
		return
	}
	s.answered(n, i, by, AnswerUnknown, name+"'s client gives up on its request")
}

// abandon leaves req, unprocessed, at the provider, as an orphan of key
// i; false when the model's bound on orphans is reached.
func abandon(w *world, i int8, req requestM) bool {
	if req.processed {
		return true
	}
	k := 0
	if req.recorded {
		k = 1
	}
	if w.ev[i].orphans[k] >= maxOrphans {
		return false
	}
	w.ev[i].orphans[k]++
	return true
}

// answered settles the claim as the rules' transition function says and
// carries out the pipeline's failure policy.
func (s *stepper) answered(w world, i, by int8, ans Answer, label string) {
	a := w.ev[i].att[by]
	if ans == AnswerCharged {
		n := w
		if owns(n.claim, i) {
			n.claim.status, n.claim.parked = mCharged, false
			s.finish(n, i, by, outCharged, label+": recorded charged")
			return
		}
		s.r.strayCharge(s, n, i, by, label)
		return
	}
	actor := ActorEvent
	if a.created {
		actor = ActorCreator
	}
	n := w
	if ans == AnswerUnknown {
		n.ev[i].att[by].unknown = true
	}
	if ownPending(n.claim, i) {
		switch next, _, _ := s.r.next(n.claim.state(), ClaimInput{Answer: ans, Actor: actor, UnknownSeen: n.ev[i].att[by].unknown, OthersSent: n.claim.othersSent}); next {
		case ClaimBlocked:
			n.claim.status = mBlocked
		case ClaimReleased:
			if s.r.mayRelease(n.claim, i, by) {
				n.claim = claimM{}
			}
		}
	}
	var err error
	switch ans {
	case AnswerRefused:
		err = fault.Errorf(fault.Permanent, "refused")
	case AnswerConflict:
		err = fault.Errorf(fault.Conflict, "422")
	default:
		err = fault.Errorf(fault.Transient, "unknown")
	}
	s.fail(n, i, by, err, label)
}

// fail carries out the failure policy for attempt (i, by)'s error err,
// in world w (the claim already settled): every action the rules allow
// is a step.
func (s *stepper) fail(w world, i, by int8, err error, label string) {
	for _, act := range s.r.policy(w, i, by, err) {
		n := w
		switch act {
		case actRetry:
			n.ev[i].att[by].pc = pcClaim
			s.add(label+"; retries", n)
		case actDeadLetter:
			s.deadLetter(n, i, by, reasonBit(err), label+"; dead-lettered "+fault.KindOf(err).String())
		case actPark:
			if parkable(n, i) {
				n.claim.parked, n.claim.othersSent = true, true
				s.r.parkKeeps(&n, i, recordOf(n, i, by))
				s.finish(n, i, by, outParked, label+"; parked")
			}
		case actDefer:
			if s.r.mayDefer(w, i) {
				if n.ev[i].deferred == 0 {
					n.ev[i].deferred, n.ev[i].deferredRec = n.lastDeferred()+1, recordOf(n, i, by)
				}
				s.finish(n, i, by, outDeferred, label+"; deferred")
			}
		case actGiveBack:
			n.ev[i].att[by] = attemptM{}
			if n.claim.exists && n.claim.owner == i && n.claim.creator == by+1 {
				n.claim.creator = 0
			}
			s.add(label+"; the deferred row is given back", n)
		}
	}
}

func reasonBit(err error) uint8 {
	switch fault.KindOf(err) {
	case fault.Conflict:
		return dlqConflict
	case fault.Permanent:
		return dlqPermanent
	default:
		return dlqExhausted
	}
}

// busy is a Busy answer: the event waits (retries) or is deferred.
func (s *stepper) busy(i, by int8, label string) {
	s.fail(s.from, i, by, fault.Errorf(fault.Busy, "busy"), label)
}

// deadLetter records the decision and writes the dead letter, with the
// reason stored before if the rules keep one, and ends the attempt: the
// consumer's commits the record, the decider's deletes the deferred row.
func (s *stepper) deadLetter(w world, i, by int8, reason uint8, label string) {
	count := recordOf(w, i, by)
	if kept := s.r.keeps(w, i, count); kept != 0 {
		reason = kept
	} else {
		w.ev[i].decision, w.ev[i].decidedAt = reason, max(w.ev[i].decidedAt, count)
	}
	w.ev[i].dlq |= reason
	s.end(w, i, by, label)
}

// recordOf is the dlq-replay-count of the record attempt by of event i
// decides: the consumer's delivery (the original's, 0, when late), or
// the deferred row's.
func recordOf(w world, i, by int8) int8 {
	switch {
	case by == byDecider:
		return w.ev[i].deferredRec
	case w.ev[i].att[by].stale:
		return 0
	}
	return w.ev[i].replays
}

// finish records a decided outcome and ends the attempt.
func (s *stepper) finish(w world, i, by int8, outcome uint8, label string) {
	w.ev[i].outcomes |= outcome & keptOutcomes
	s.end(w, i, by, label)
}

func (s *stepper) end(w world, i, by int8, label string) {
	stale := w.ev[i].att[by].stale
	w.ev[i].att[by] = attemptM{}
	if w.claim.exists && w.claim.owner == i && w.claim.creator == by+1 {
		w.claim.creator = 0
	}
	switch {
	case stale: // the original record's commit: the current one's stays as it is
	case by == byConsumer:
		w.ev[i].committed = true
	default:
		w.ev[i].deferred, w.ev[i].deferredRec = 0, 0
	}
	s.add(label, w)
}

// decideDeferred: the deciding loop takes a deferred row up when the rules
// allow, as a fresh attempt.
func (s *stepper) decideDeferred(i int8) {
	w := s.from
	e := w.ev[i]
	if e.deferred == 0 || e.att[byDecider].pc != pcIdle || w.fo.gate || !s.r.mayTake(w, i) {
		return
	}
	if s.r.senderWaitsOnPause(byDecider) && w.paused {
		return
	}
	n := w
	n.ev[i].att[byDecider] = attemptM{pc: pcClaim}
	s.add("the deciding loop takes "+eventNames[i]+"'s deferred row", n)
}

// provider: a request is processed, taking or refusing the charge; a
// key's first result is stored and answers every later request under it.
// An answer that never reaches its sender (a 5xx, a timeout, a reset) is
// the sender giving up; a request abandoned so may also be dropped
// unprocessed.
func (s *stepper) provider() {
	w := s.from
	process := func(key int8, orphan bool, label string, set func(n *world, ans Answer)) {
		answers := []Answer{w.keys[key].a()}
		if w.keys[key].a() == AnswerNone {
			answers = []Answer{AnswerCharged, AnswerRefused}
		}
		if orphan {
			answers = append(answers, AnswerUnknown) // dropped unprocessed
		}
		for _, ans := range answers {
			n := w
			if ans != AnswerUnknown {
				n.keys[key] = manswer(ans)
			}
			set(&n, ans)
			s.add("provider answers "+label+": "+answerName(ans), n)
		}
	}
	for i := range w.n {
		for by, a := range w.ev[i].att {
			if a.pc == pcAwait && !a.req.processed {
				process(i, false, eventNames[i]+"'s request", func(n *world, ans Answer) {
					n.ev[i].att[by].req.processed, n.ev[i].att[by].req.answer = true, manswer(ans)
				})
			}
		}
		for k, o := range w.ev[i].orphans {
			if o > 0 {
				process(i, true, "an abandoned request of "+eventNames[i], func(n *world, _ Answer) { n.ev[i].orphans[k]-- })
			}
		}
	}
	if c := w.comp; c.busy && !c.req.processed {
		process(c.key, false, "the completer's request for "+eventNames[c.key], func(n *world, ans Answer) {
			n.comp.req.processed, n.comp.req.answer = true, manswer(ans)
		})
	}
}
