package billing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// Recorded sends (SPEC §11 I5): before any request for a claim leaves the
// process, its sender commits in_flight_until = now() + D on the claim,
// where D is the sender's whole deadline, fixed before the record, and it
// never sends after that deadline: the Charger gets a context that ends
// then. decide_after = now() + D + the provider's bound goes beside it, so
// that an operator's `claim release` or `claim mark-charged` (operator.go)
// can tell from the database alone when no request of the claim can still
// take money. The creator's first send is recorded by the claim insert
// (claimSQL); every other — the creator's retries, a redelivery, the
// completer, reconcile — by markSent, which also adds a claim_send row.

// SendConfig is how a sender records its sends. The zero value is usable
// (see withDefaults).
type SendConfig struct {
	// Deadline is D, a send's whole deadline from the moment it is recorded:
	// the transaction steps before the request, a wait for a charge worker,
	// and the request itself (BILLING_PAYMENT_TIMEOUT plus
	// BILLING_DB_TIMEOUT in the service). A request that has not answered
	// by then is given up (an unknown outcome); one not yet sent is never
	// sent. Zero means 30 s.
	Deadline time.Duration
	// ProviderMaxProcessing is BILLING_PROVIDER_MAX_PROCESSING: how long
	// the provider may still finish a request the client gave up on. Zero
	// adds nothing.
	ProviderMaxProcessing time.Duration
	// Host names the sender's replica in claim_send and charge.claimed_by.
	Host string
}

func (c SendConfig) withDefaults() SendConfig {
	if c.Deadline <= 0 {
		c.Deadline = 30 * time.Second
	}
	return c
}

// deadline is the deadline of a send about to be recorded: fixed before
// the record, so that the database's now() + D it writes is never earlier.
func (c SendConfig) deadline() time.Time { return time.Now().Add(c.Deadline) }

// The senders, as claim_send.sender names them.
const (
	SenderCreator    = "creator"    // a retry of the attempt that made the claim
	SenderRedelivery = "redelivery" // another attempt of the claim's event
	SenderCompleter  = "completer"
	SenderReconcile  = "reconcile"
)

// claimWon is the claim phase's answer for ev, whose claim the claim
// statement has just created: its creator asks the claim's transition
// function whether to send (ClaimState.Next: a pending claim, of age 0 by
// the database's clock). The send row's EffectRecordSend is done, by
// claimSQL's insert (recorded); its EffectSend is the charge phase's. The
// pause is asked where the requests leave (chargeAll), and the
// block-after rule cannot stop a claim just made; anything but a send
// leaves the claim to the retry, which decides from the ledger (decide).
func (s *Service) claimWon(ev events.OrderConfirmed) claimed {
	_, effects, _ := ClaimPending.Next(ClaimInput{Actor: ActorCreator, BlockAfter: s.claimBlockAfter})
	if !slices.Contains(effects, EffectSend) {
		return claimed{err: fault.Errorf(fault.Transient, "order %d: the new claim of event %s is not sent", ev.OrderID, ev.EventID)}
	}
	return claimed{charge: true, created: true, recorded: slices.Contains(effects, EffectRecordSend)}
}

// markSent records durably, in a statement committed on its own before
// any request leaves the process, that senders[k] sends the request of the
// claim (orders[k], ids[k]), with cfg's deadline and bound
// (Ledger.RecordSends), and returns the event ids whose claims are still
// pending: only those may be sent. The caller fixed its deadline
// (cfg.deadline) before calling. Its error means that nothing may be
// sent. The charge path and the completer share it.
func markSent(ctx context.Context, db Ledger, timeout time.Duration, cfg SendConfig, orders []int64, ids []uuid.UUID, senders []string) (map[uuid.UUID]bool, error) {
	mctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	marked, err := db.RecordSends(mctx, cfg, orders, ids, senders)
	if err != nil {
		return nil, err
	}
	return idSet(marked), nil
}

// errMovedMeanwhile is the error of an event whose claim was released or
// settled between its lookup and markSent: nothing was sent, and
// processAll decides it again from the ledger at once.
var errMovedMeanwhile = errors.New("the claim was released or settled before its request was sent; nothing sent, deciding again")

// recordSends runs markSent for the events whose sends the claim
// statement did not record and returns the indexes of the events that may
// be charged: those the claim statement recorded, and those whose claim is
// still pending. The others get a Transient error (nothing sent; their
// retry decides again from the ledger). Its error means that nothing may
// be sent.
func (s *Service) recordSends(ctx context.Context, evs []events.OrderConfirmed, created, recorded []bool, out []response) ([]int, error) {
	var others []int
	for i := range evs {
		if !recorded[i] {
			others = append(others, i)
		}
	}
	if len(others) == 0 {
		all := make([]int, len(evs))
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	orders, ids, senders := make([]int64, len(others)), make([]uuid.UUID, len(others)), make([]string, len(others))
	for k, i := range byOrder(evs, others) {
		orders[k], ids[k], senders[k] = evs[i].OrderID, evs[i].EventID, SenderRedelivery
		if created[i] {
			senders[k] = SenderCreator
		}
	}
	pending, err := markSent(ctx, s.store, s.dbTimeout, s.sends, orders, ids, senders)
	if err != nil {
		return nil, err
	}
	may := make([]int, 0, len(evs))
	for i, ev := range evs {
		if recorded[i] || pending[ev.EventID] {
			may = append(may, i)
			continue
		}
		out[i].err = fault.New(fault.Transient, fmt.Errorf("order %d: %w", ev.OrderID, errMovedMeanwhile))
	}
	return may, nil
}
