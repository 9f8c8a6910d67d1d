package billing

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// Claim is an order's row in the charge ledger.
type Claim struct {
	OrderID    int64
	EventID    uuid.UUID
	CustomerID int64
	Amount     money.Amount
	// Status is the claim's state, parked included (ClaimStateOf).
	Status    ClaimState
	ClaimedAt time.Time
	// Age is how old the claim was when it was read, by the database's
	// clock (now() - claimed_at), never a replica's: replicas with skewed
	// clocks agree on it (SPEC §10).
	Age time.Duration
	// Attempt is the claim_token of the attempt that created the claim.
	Attempt uuid.UUID
}

// verdict is what an existing ledger row means for an event.
type verdict int

const (
	// verdictDone: the event is decided without a charge (an outcome or
	// an error).
	verdictDone verdict = iota
	// verdictCharge: the row is the event's own pending claim: charge
	// again with the same key and body.
	verdictCharge
	// verdictReclaim: no row stopped the claim after all (its owner
	// released it meanwhile): claim again.
	verdictReclaim
	// verdictBlock: the row is the event's own pending claim, too old to
	// re-send (ClaimState.Next): block it; the event is held behind it
	// (ErrHeld), decided with the operator's decision.
	verdictBlock
)

// decide is the one place that says what an existing claim means for ev,
// for the single and the batched path alike. found is false when the
// claim's insert conflicted but no row turned up. Whether ev's own pending
// or parked claim is sent again is the claim's transition function's
// (ClaimState.Next, an attempt of the event asking to send): its send row
// is verdictCharge (markSent records the send); older than blockAfter
// (the provider may have forgotten its key), verdictBlock. An event behind a
// blocked claim, its own or another event's, is held (ErrHeld), never a
// Conflict: the operator's decision on the claim decides it (SPEC §11, I3).
// A Conflict is only a true one: another body under the event's id, or
// another amount for an order another event charged.
func decide(row Claim, found bool, ev events.OrderConfirmed, blockAfter time.Duration) (verdict, Outcome, error) {
	own := found && row.OrderID == ev.OrderID && row.EventID == ev.EventID && row.Status.Unsettled() &&
		row.Amount == ev.TotalAmount && row.CustomerID == ev.CustomerID
	if own {
		switch next, effects, _ := row.Status.Next(ClaimInput{Actor: ActorEvent, Age: row.Age, BlockAfter: blockAfter}); {
		case next == ClaimBlocked:
			return verdictBlock, "", heldf("order %d: the claim of event %s is %s old, past the block-after limit: its request is not re-sent (the provider may have forgotten the key); blocked, an operator decides",
				ev.OrderID, ev.EventID, row.Age.Round(time.Second))
		case slices.Contains(effects, EffectSend):
			return verdictCharge, "", nil
		}
		return verdictDone, "", fault.Errorf(fault.Transient, "order %d: the claim of event %s is neither sent nor blocked", ev.OrderID, ev.EventID)
	}
	switch {
	case !found:
		return verdictReclaim, "", nil
	case row.OrderID != ev.OrderID:
		return verdictDone, "", fault.Errorf(fault.Conflict, "event %s already claimed order %d, not %d", ev.EventID, row.OrderID, ev.OrderID)
	case row.EventID == ev.EventID && (row.Amount != ev.TotalAmount || row.CustomerID != ev.CustomerID):
		return verdictDone, "", fault.Errorf(fault.Conflict, "event %s claimed order %d with other parameters (customer %d, amount %s)",
			ev.EventID, ev.OrderID, row.CustomerID, row.Amount)
	case row.Status == ClaimBlocked:
		return verdictDone, "", heldf("order %d: the claim of event %s is blocked; an operator decides it, and this event with it", ev.OrderID, row.EventID)
	case row.EventID == ev.EventID:
		return verdictDone, Duplicate, nil
	case row.Status.Unsettled():
		return verdictDone, "", fault.Errorf(fault.Busy, "order %d is claimed by event %s, whose charge is not settled yet", ev.OrderID, row.EventID)
	case row.Amount != ev.TotalAmount || row.CustomerID != ev.CustomerID:
		return verdictDone, "", fault.Errorf(fault.Conflict, "order %d already charged by event %s with other parameters", ev.OrderID, row.EventID)
	default:
		return verdictDone, DuplicateOrder, nil
	}
}

// claimed is the claim phase's answer for one event.
type claimed struct {
	// charge is true when the event must be charged: created says whether
	// this attempt created the claim (only then may a definite refusal
	// release it), recorded whether the claim statement that created it
	// just now recorded its send (else markSent must, before it is sent).
	charge, created, recorded bool
	res                       Result
	err                       error
}

// claimAll claims the orders of evs, which must have distinct event ids,
// in one statement, and decides every event whose claim an existing row
// stopped. An event whose stopping row vanished meanwhile is claimed
// again, a few times. attempts[i] is evs[i]'s attempt: a claim it creates
// carries its id as claim_token.
func (s *Service) claimAll(ctx context.Context, evs []events.OrderConfirmed, attempts []*attempt) []claimed {
	out := make([]claimed, len(evs))
	todo := make([]int, len(evs))
	for i := range todo {
		todo[i] = i
	}
	for try := 0; len(todo) > 0; try++ {
		if try == 3 {
			for _, i := range todo {
				out[i].err = fault.Errorf(fault.Transient, "claim of order %d keeps racing with its release", evs[i].OrderID)
			}
			break
		}
		var err error
		if todo, err = s.claimOnce(ctx, evs, attempts, todo, out); err != nil {
			for _, i := range todo {
				out[i].err = err
			}
			break
		}
	}
	return out
}

// claimOnce claims the events evs[todo], fills in out and returns those to
// claim again.
func (s *Service) claimOnce(ctx context.Context, evs []events.OrderConfirmed, attempts []*attempt, todo []int, out []claimed) ([]int, error) {
	claims := make([]NewClaim, len(todo))
	for k, i := range todo {
		ev := evs[i]
		claims[k] = NewClaim{OrderID: ev.OrderID, EventID: ev.EventID, CustomerID: ev.CustomerID, Amount: ev.TotalAmount,
			Attempt: attempts[i].id, ReplayCount: attempts[i].replay}
	}
	cctx, cancel := s.live(ctx)
	defer cancel()
	answers, err := s.store.ClaimOrders(cctx, s.group, s.sends, claims)
	if err != nil {
		// The statement's outcome may be unknown: it may have committed.
		// Each event finds out on its retry, which sees its own pending
		// claim.
		return todo, err
	}
	byEvent := make(map[uuid.UUID]ClaimAnswer, len(answers))
	for _, a := range answers {
		byEvent[a.EventID] = a
	}
	var lost []int
	for _, i := range todo {
		switch a, ok := byEvent[evs[i].EventID]; {
		case !ok:
			lost = append(lost, i)
		case a.Decided:
			out[i] = claimed{err: decidedBefore(a.Reason, a.Cause)}
		default:
			out[i] = s.claimWon(evs[i])
		}
	}
	if len(lost) == 0 {
		return nil, nil
	}
	existing, err := s.lookup(ctx, evs, lost)
	if err != nil {
		return lost, err
	}
	var again []int
	for _, i := range lost {
		ev := evs[i]
		row, found := existing.forEvent(ev)
		switch v, outcome, err := decide(row, found, ev, s.claimBlockAfter); v {
		case verdictReclaim:
			if by, held := existing.heldBy[ev.EventID]; held {
				out[i] = claimed{err: fault.Errorf(fault.Busy, "order %d is held for event %s, deferred before this one and decided first", ev.OrderID, by)}
				continue
			}
			again = append(again, i)
		case verdictCharge:
			// Our own claim: created by this attempt when an earlier try of
			// it lost the claim statement's answer, or a retry of it.
			out[i] = claimed{charge: true, created: row.Attempt == attempts[i].id}
		case verdictBlock:
			s.block(ctx, []events.OrderConfirmed{ev}, err.Error())
			out[i] = claimed{err: err}
		default:
			out[i] = claimed{res: Result{Outcome: outcome}, err: err}
			if outcome == DuplicateOrder {
				s.logger.InfoContext(ctx, "order already charged by another event", "event_id", ev.EventID,
					"order_id", ev.OrderID, "charged_by", row.EventID)
			}
		}
	}
	return again, nil
}

// ledgerRows are the rows lookup found, by order and by event, and for
// the events without a row for their order, the deferred event that holds
// it, if one does.
type ledgerRows struct {
	byOrder map[int64]Claim
	byEvent map[uuid.UUID]Claim
	heldBy  map[uuid.UUID]uuid.UUID
}

// forEvent returns the row that decides ev: its event_id on another order
// first (a forged or buggy event), else its order's row.
func (l ledgerRows) forEvent(ev events.OrderConfirmed) (Claim, bool) {
	if r, ok := l.byEvent[ev.EventID]; ok && r.OrderID != ev.OrderID {
		return r, true
	}
	r, ok := l.byOrder[ev.OrderID]
	return r, ok
}

// lookup reads the ledger rows that stopped the claims of evs[idx].
func (s *Service) lookup(ctx context.Context, evs []events.OrderConfirmed, idx []int) (ledgerRows, error) {
	orders, ids := make([]int64, len(idx)), make([]uuid.UUID, len(idx))
	for k, i := range idx {
		orders[k], ids[k] = evs[i].OrderID, evs[i].EventID
	}
	cctx, cancel := s.live(ctx)
	defer cancel()
	claims, err := s.store.LookupClaims(cctx, orders, ids)
	if err != nil {
		return ledgerRows{}, err
	}
	l := ledgerRows{byOrder: map[int64]Claim{}, byEvent: map[uuid.UUID]Claim{}, heldBy: map[uuid.UUID]uuid.UUID{}}
	for _, c := range claims {
		l.byOrder[c.OrderID], l.byEvent[c.EventID] = c, c
	}
	var unclaimed []int
	for k, i := range idx {
		if _, ok := l.byOrder[orders[k]]; !ok {
			unclaimed = append(unclaimed, i)
		}
	}
	if len(unclaimed) > 0 {
		if l.heldBy, err = s.held(ctx, evs, unclaimed); err != nil {
			return ledgerRows{}, err
		}
	}
	return l, nil
}

// idSet is the set of ids, for the statements that answer the event ids
// they claimed, marked, held or released.
func idSet(ids []uuid.UUID) map[uuid.UUID]bool {
	set := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}

// byOrder returns idx sorted by the order ids of evs: the ledger
// statements lock their rows in the order given, and one order across
// them keeps two batches from deadlocking on each other's rows.
func byOrder(evs []events.OrderConfirmed, idx []int) []int {
	sorted := slices.Clone(idx)
	slices.SortFunc(sorted, func(a, b int) int { return cmp.Compare(evs[a].OrderID, evs[b].OrderID) })
	return sorted
}

// release deletes the claims of evs, each created by the attempt whose
// claim_token is tokens[k], as far as the release rule still allows on the
// row (Store.ReleaseClaims), and returns the event ids released. It is best effort:
// when it fails, the claims stay pending, which is always safe.
func (s *Service) release(ctx context.Context, evs []events.OrderConfirmed, tokens []uuid.UUID) map[uuid.UUID]bool {
	if len(evs) == 0 {
		return nil
	}
	orders, ids, toks := make([]int64, len(evs)), make([]uuid.UUID, len(evs)), make([]uuid.UUID, len(evs))
	all := make([]int, len(evs))
	for i := range all {
		all[i] = i
	}
	for k, i := range byOrder(evs, all) {
		orders[k], ids[k], toks[k] = evs[i].OrderID, evs[i].EventID, tokens[i]
	}
	wctx, cancel := s.detached(ctx)
	defer cancel()
	released, err := s.store.ReleaseClaims(wctx, orders, ids, toks)
	if err != nil {
		s.logger.WarnContext(ctx, "claims left pending: releasing them failed", "orders", orders, "err", err)
		return nil
	}
	return idSet(released)
}

// block marks the pending claims of evs blocked for an operator, each
// with why as its last error, on its own, and logs each. Best effort, like
// release.
func (s *Service) block(ctx context.Context, evs []events.OrderConfirmed, why string) {
	for _, ev := range evs {
		wctx, cancel := s.detached(ctx)
		_, err := s.store.BlockClaims(wctx, []int64{ev.OrderID}, []uuid.UUID{ev.EventID}, why)
		cancel()
		if err != nil {
			s.logger.WarnContext(ctx, "claim left pending: blocking it failed", "order_id", ev.OrderID, "err", err)
			continue
		}
		s.logger.ErrorContext(ctx, "ledger claim blocked: an operator must decide", "order_id", ev.OrderID,
			"event_id", ev.EventID, "reason", why)
	}
}
