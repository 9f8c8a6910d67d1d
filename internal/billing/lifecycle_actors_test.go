package billing

import "time"

// The model's other actors: the completer, the operator, and the world
// around the service (pause, crashes, time).

// completer: one send at a time (the advisory lock) for any pending claim
// (the model does not count the completer's After: it may act early, as a
// replica whose clock runs ahead would).
func (s *stepper) completer() {
	w := s.from
	c := w.claim
	// The completer takes a claim older than its After: the model lets it
	// do so at any moment, whatever the creating attempt is doing (an
	// attempt may be held through a long outage).
	due := c.exists && c.status == mPending
	if !w.comp.busy && due && !(s.r.completerWaitsOnPause() && w.paused) && !w.fo.gate {
		n := w
		next, _, _ := s.r.next(c.state(), ClaimInput{Actor: ActorCompleter, Age: modelAgeOf(c), BlockAfter: modelBlockAfter})
		if next == ClaimBlocked {
			n.claim.status = mBlocked
			s.add("completer blocks "+eventNames[c.owner]+"'s claim: past block-after", n)
		} else {
			n.claim.othersSent = true
			n.claim.held++
			n.comp = completerM{busy: true, key: c.owner, req: requestM{recorded: s.r.recordsSend(false, false)}}
			n.sentPause = n.sentPause || n.paused
			s.add("completer re-sends "+eventNames[c.owner]+"'s request", n)
		}
	}
	if !w.comp.busy {
		return
	}
	key := w.comp.key
	settle := func(n world, ans Answer, label string) {
		n.comp = completerM{}
		n.claim.held--
		if owns(n.claim, key) {
			cur := n.claim.state()
			next, _, _ := s.r.next(cur, ClaimInput{Answer: ans, Actor: ActorCompleter, Age: modelAgeOf(n.claim), BlockAfter: modelBlockAfter})
			switch {
			case next == cur:
			case next == ClaimCharged:
				n.claim.status, n.claim.parked = mCharged, false
			case next == ClaimBlocked:
				n.claim.status = mBlocked
			}
		}
		s.add(label, n)
	}
	req := w.comp.req
	if req.processed {
		settle(w, req.answer.a(), "completer gets "+answerName(req.answer.a()))
	}
	n := w
	if abandon(&n, key, req) {
		settle(n, AnswerUnknown, "completer's client gives up")
	}
}

func modelAgeOf(c claimM) time.Duration {
	if c.old {
		return modelOld
	}
	return modelYoung
}

// operator follows the runbooks of a blocked or a long-pending claim: the
// provider holds a charge for the claim's key → mark-charged; it holds
// none → release. The command runs as the rules allow (the production's
// operator transition refuses a release of a pending claim), and it races
// a request when one for the claim's key is still at the provider. A
// claim with stray charges (the 2xx rule) is an order the provider has
// charged under another key: the runbook marks it charged, never
// releases it. A claim the failover heal blocked has its own runbook: the
// operator looks every event's key up, marks it charged if one was
// charged, and releases it if none was (operatorCharged, operatorRaces).
func (s *stepper) operator() {
	w := s.from
	c := w.claim
	if !c.exists || c.status == mCharged || !s.r.operatorMay(w) {
		return
	}
	charged := w.operatorCharged()
	req := OperatorRequest{Operator: "model", Reason: "runbook", ProviderHoldsNoCharge: !charged}
	req.Action = ActionRelease
	if charged {
		req.Action, req.ChargeID = ActionMarkCharged, "ch_model"
	}
	next, _, err := s.r.next(c.state(), ClaimInput{Actor: ActorOperator, Operator: operatorMove(req, c)})
	if err != nil {
		return
	}
	n := w
	n.raced = n.raced || w.operatorRaces()
	if next == ClaimReleased {
		n.claim = claimM{}
		s.add("operator releases "+eventNames[c.owner]+"'s "+string(c.status.claim())+" claim (the provider holds no charge)", n)
		return
	}
	n.claim.status = mstatusOf(next)
	s.add("operator marks "+eventNames[c.owner]+"'s "+string(c.status.claim())+" claim charged", n)
}

// operatorMove is the operator's req on the model's claim c: the in-flight
// window is operatorMay's (the rules' guard), so Window is left empty.
func operatorMove(req OperatorRequest, c claimM) OperatorMove {
	return OperatorMove{Action: req.Action, ProviderHoldsNoCharge: req.ProviderHoldsNoCharge, ChargeID: req.ChargeID,
		StrayCharges: int(c.strays)}
}

// environment: pause and resume, a crash, a claim ageing past
// block-after.
func (s *stepper) environment() {
	w := s.from
	if !w.paused && w.budget.pause > 0 {
		n := w
		n.paused = true
		n.budget.pause--
		s.add("operator pauses billing", n)
	}
	if w.paused {
		n := w
		n.paused = false
		s.add("operator resumes billing", n)
	}
	if n, ok := crashed(w); ok {
		s.add("every replica crashes", n)
	}
	if w.claim.exists && !w.claim.old && w.claim.status != mCharged {
		n := w
		n.claim.old = true
		s.add(eventNames[w.claim.owner]+"'s claim ages past block-after", n)
	}
}

// crashed is w after every replica crashed: every attempt and the
// completer's send gone, their requests left at the provider; false when
// the budget (or the bound on abandoned requests) allows no crash.
func crashed(w world) (world, bool) {
	if w.budget.crash == 0 {
		return w, false
	}
	n, ok := crashAll(w)
	n.budget.crash--
	return n, ok
}

// crashAll is w after every replica crashed, whatever the budget.
func crashAll(w world) (world, bool) {
	n := w
	for i := range n.n {
		for _, a := range w.ev[i].att {
			if a.pc == pcAwait && !abandon(&n, i, a.req) {
				return w, false
			}
		}
		n.ev[i].att = [bySenders]attemptM{}
	}
	if w.comp.busy && !abandon(&n, w.comp.key, w.comp.req) {
		return w, false
	}
	n.claim.creator, n.claim.held = 0, 0
	n.comp = completerM{}
	return n, true
}
