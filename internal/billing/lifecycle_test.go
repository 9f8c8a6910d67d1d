package billing_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
)

// TestClaimStateNext is the claim's transition function's table, row by
// row as its doc comment gives it, for every state a sender may find its
// own claim in, plus the edges of the block-after rule and the pause.
func TestClaimStateNext(t *testing.T) {
	const (
		pending  = billing.ClaimPending
		parked   = billing.ClaimParked
		charged  = billing.ClaimCharged
		blocked  = billing.ClaimBlocked
		released = billing.ClaimReleased
	)
	type in = billing.ClaimInput
	const (
		send    = billing.EffectSend
		record  = billing.EffectRecordSend
		mark    = billing.EffectMarkCharged
		block   = billing.EffectBlock
		release = billing.EffectRelease
		park    = billing.EffectPark
		unknown = billing.EffectRecordUnknown
		stray   = billing.EffectRecordStray
	)
	creator, event, completer := billing.ActorCreator, billing.ActorEvent, billing.ActorCompleter
	hour := time.Hour
	type row struct {
		name    string
		from    billing.ClaimState
		in      in
		want    billing.ClaimState
		effects []billing.Effect
		err     error
	}
	rows := []row{
		{"stray 2xx, no row: the event's own claim, charged", released, in{Actor: billing.ActorStray}, charged, []billing.Effect{mark, stray}, nil},
		{"stray 2xx, another's pending: blocked", pending, in{Actor: billing.ActorStray}, blocked, []billing.Effect{block, stray}, nil},
		{"stray 2xx, another's parked: blocked", parked, in{Actor: billing.ActorStray}, blocked, []billing.Effect{block, stray}, nil},
		{"stray 2xx, another's charged: recorded", charged, in{Actor: billing.ActorStray}, charged, []billing.Effect{stray}, nil},
		{"stray 2xx, another's blocked: recorded", blocked, in{Actor: billing.ActorStray}, blocked, []billing.Effect{stray}, nil},

		{"park, creator", pending, in{Park: true}, parked, []billing.Effect{park}, nil},
		{"park, other attempt", pending, in{Park: true, Actor: event}, parked, []billing.Effect{park}, nil},
		{"park again", parked, in{Park: true, Actor: event}, parked, []billing.Effect{park}, nil},
		{"park a blocked claim: nothing", blocked, in{Park: true}, blocked, nil, nil},
	}
	for _, from := range []billing.ClaimState{pending, parked} {
		f := string(from) + ", "
		rows = append(rows,
			row{f + "none: send", from, in{Age: time.Minute, BlockAfter: hour}, from, []billing.Effect{record, send}, nil},
			row{f + "none, no limit: send", from, in{Age: 1000 * hour}, from, []billing.Effect{record, send}, nil},
			row{f + "none, at the limit: send", from, in{Age: hour, BlockAfter: hour}, from, []billing.Effect{record, send}, nil},
			row{f + "none, past the limit: blocked unsent", from, in{Age: hour + time.Second, BlockAfter: hour}, blocked, []billing.Effect{block}, nil},
			row{f + "none, past the limit, completer", from, in{Actor: completer, Age: 2 * hour, BlockAfter: hour}, blocked, []billing.Effect{block}, nil},
			row{f + "none, paused: nothing", from, in{Actor: completer, Paused: true, Age: 2 * hour, BlockAfter: hour}, from, nil, billing.ErrPaused},
			row{f + "none, paused, event: nothing", from, in{Actor: event, Paused: true}, from, nil, billing.ErrPaused},
			row{f + "park by the completer: a send", from, in{Actor: completer, Park: true}, from, []billing.Effect{record, send}, nil},

			row{f + "2xx, creator", from, in{Answer: billing.AnswerCharged}, charged, []billing.Effect{mark}, nil},
			row{f + "2xx, other attempt", from, in{Answer: billing.AnswerCharged, Actor: event}, charged, []billing.Effect{mark}, nil},
			row{f + "2xx, completer", from, in{Answer: billing.AnswerCharged, Actor: completer}, charged, []billing.Effect{mark}, nil},

			row{f + "422, creator", from, in{Answer: billing.AnswerConflict}, blocked, []billing.Effect{block}, nil},
			row{f + "422, other attempt", from, in{Answer: billing.AnswerConflict, Actor: event}, blocked, []billing.Effect{block}, nil},
			row{f + "422, completer", from, in{Answer: billing.AnswerConflict, Actor: completer}, blocked, []billing.Effect{block}, nil},

			row{f + "refused, creator, nothing unknown, no other sender", from, in{Answer: billing.AnswerRefused}, released, []billing.Effect{release}, nil},
			row{f + "refused, creator after an unknown outcome", from, in{Answer: billing.AnswerRefused, UnknownSeen: true}, from, nil, nil},
			row{f + "refused, creator, another attempt sent", from, in{Answer: billing.AnswerRefused, OthersSent: true}, from, nil, nil},
			row{f + "refused, other attempt", from, in{Answer: billing.AnswerRefused, Actor: event}, from, nil, nil},
			row{f + "refused, completer", from, in{Answer: billing.AnswerRefused, Actor: completer}, blocked, []billing.Effect{block}, nil},

			row{f + "unknown, creator", from, in{Answer: billing.AnswerUnknown}, from, nil, nil},
			row{f + "unknown, other attempt", from, in{Answer: billing.AnswerUnknown, Actor: event}, from, nil, nil},
			row{f + "unknown, completer: counted", from, in{Answer: billing.AnswerUnknown, Actor: completer}, from, []billing.Effect{unknown}, nil},
		)
	}
	// A settled claim: a 2xx for its key is recorded (blocked -> charged,
	// charged again); every other answer or question changes nothing.
	for _, from := range []billing.ClaimState{blocked, charged} {
		for _, actor := range []billing.Actor{creator, event, completer} {
			for _, ans := range []billing.Answer{billing.AnswerNone, billing.AnswerRefused, billing.AnswerConflict, billing.AnswerUnknown} {
				rows = append(rows, row{string(from) + ", settled: nothing", from, in{Actor: actor, Answer: ans, Age: 2 * hour, BlockAfter: hour}, from, nil, nil})
			}
			rows = append(rows, row{string(from) + ", 2xx: charged", from, in{Actor: actor, Answer: billing.AnswerCharged}, charged, []billing.Effect{mark}, nil})
		}
	}
	for _, tc := range rows {
		got, effects, err := tc.from.Next(tc.in)
		if got != tc.want || !slices.Equal(effects, tc.effects) || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("%s: %s.Next(%+v) = %s, %v, %v; want %s, %v, %v", tc.name, tc.from, tc.in, got, effects, err, tc.want, tc.effects, tc.err)
		}
	}
}

// TestClaimStateNextOperator is the operator's part of the table: every
// state and move, the facts that refuse a move (the flag, the charge id,
// a stray charge, a request in flight), and the effects of an allowed one.
func TestClaimStateNextOperator(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	release := billing.OperatorMove{Action: billing.ActionRelease, ProviderHoldsNoCharge: true}
	mark := billing.OperatorMove{Action: billing.ActionMarkCharged, ChargeID: "ch_1"}
	with := func(m billing.OperatorMove, f func(*billing.OperatorMove)) billing.OperatorMove { f(&m); return m }
	noFlag := with(release, func(m *billing.OperatorMove) { m.ProviderHoldsNoCharge = false })
	stray := func(m billing.OperatorMove) billing.OperatorMove {
		return with(m, func(m *billing.OperatorMove) { m.StrayCharges = 1 })
	}
	inFlight := func(m billing.OperatorMove) billing.OperatorMove {
		return with(m, func(m *billing.OperatorMove) {
			m.Window = billing.InFlightFacts{Now: now, InFlightUntil: now.Add(time.Minute), DecideAfter: now.Add(6 * time.Minute)}
		})
	}
	oldReplica := func(m billing.OperatorMove) billing.OperatorMove {
		return with(m, func(m *billing.OperatorMove) {
			m.Window = billing.InFlightFacts{Now: now, OldReplicas: 1, OldUntil: now.Add(time.Hour), OldWho: "r1 (level 8)", Bound: 5 * time.Minute}
		})
	}
	past := func(m billing.OperatorMove) billing.OperatorMove {
		return with(m, func(m *billing.OperatorMove) {
			m.Window = billing.InFlightFacts{Now: now, InFlightUntil: now.Add(-6 * time.Minute), DecideAfter: now.Add(-time.Minute)}
		})
	}
	released, charged := []billing.Effect{billing.EffectRelease, billing.EffectAudit}, []billing.Effect{billing.EffectMarkCharged, billing.EffectAudit}
	for _, tc := range []struct {
		name    string
		from    billing.ClaimState
		move    billing.OperatorMove
		want    billing.ClaimState
		effects []billing.Effect
		allowed time.Time // of an *InFlightError
	}{
		{"release blocked", billing.ClaimBlocked, release, billing.ClaimReleased, released, time.Time{}},
		{"release blocked, in-flight window passed", billing.ClaimBlocked, past(release), billing.ClaimReleased, released, time.Time{}},
		{"release blocked without the flag", billing.ClaimBlocked, noFlag, billing.ClaimBlocked, nil, time.Time{}},
		{"release blocked with a stray charge", billing.ClaimBlocked, stray(release), billing.ClaimBlocked, nil, time.Time{}},
		{"release blocked, in flight", billing.ClaimBlocked, inFlight(release), billing.ClaimBlocked, nil, now.Add(6 * time.Minute)},
		{"release blocked, an old replica heartbeats", billing.ClaimBlocked, oldReplica(release), billing.ClaimBlocked, nil, now.Add(time.Hour)},
		{"release pending", billing.ClaimPending, release, billing.ClaimPending, nil, time.Time{}},
		{"release parked", billing.ClaimParked, release, billing.ClaimParked, nil, time.Time{}},
		{"release charged", billing.ClaimCharged, release, billing.ClaimCharged, nil, time.Time{}},
		{"mark blocked", billing.ClaimBlocked, mark, billing.ClaimCharged, charged, time.Time{}},
		{"mark blocked with a stray charge", billing.ClaimBlocked, stray(mark), billing.ClaimCharged, charged, time.Time{}},
		{"mark pending", billing.ClaimPending, mark, billing.ClaimCharged, charged, time.Time{}},
		{"mark parked", billing.ClaimParked, mark, billing.ClaimCharged, charged, time.Time{}},
		{"mark pending, in flight", billing.ClaimPending, inFlight(mark), billing.ClaimPending, nil, now.Add(6 * time.Minute)},
		{"mark charged again", billing.ClaimCharged, mark, billing.ClaimCharged, nil, time.Time{}},
		{"mark without charge id", billing.ClaimBlocked, with(mark, func(m *billing.OperatorMove) { m.ChargeID = " " }), billing.ClaimBlocked, nil, time.Time{}},
		{"unknown action", billing.ClaimBlocked, billing.OperatorMove{Action: "delete"}, billing.ClaimBlocked, nil, time.Time{}},
	} {
		got, effects, err := tc.from.Next(billing.ClaimInput{Actor: billing.ActorOperator, Operator: tc.move})
		if got != tc.want || !slices.Equal(effects, tc.effects) {
			t.Errorf("%s: %s, %v, %v; want %s, %v", tc.name, got, effects, err, tc.want, tc.effects)
		}
		if (effects == nil) != errors.Is(err, billing.ErrUnsafe) {
			t.Errorf("%s: err %v: a refusal (ErrUnsafe) exactly when nothing is done", tc.name, err)
		}
		var inflight *billing.InFlightError
		if errors.As(err, &inflight) != !tc.allowed.IsZero() || inflight != nil && !inflight.AllowedAt.Equal(tc.allowed) {
			t.Errorf("%s: err %v; want an *InFlightError allowed at %v: %v", tc.name, err, tc.allowed, !tc.allowed.IsZero())
		}
	}
}

// TestDeferredStateNext is the deferred event's transition function's
// table: every step from every state, over every claim the order may
// have (none, the event's own or another's, in every state) and an event
// deferred before it or not.
func TestDeferredStateNext(t *testing.T) {
	states := []billing.DeferredState{billing.DeferredNone, billing.DeferredWaiting, billing.DeferredHeld, billing.DeferredLeased}
	claims := []billing.ClaimState{billing.ClaimReleased, billing.ClaimPending, billing.ClaimParked, billing.ClaimBlocked, billing.ClaimCharged}
	store := []billing.DeferredEffect{billing.DeferredStore, billing.DeferredCommit}
	for _, s := range states {
		for _, c := range claims {
			for _, own := range []bool{false, true} {
				if c == billing.ClaimReleased && own {
					continue
				}
				for _, ahead := range []bool{false, true} {
					name := func(step string) string {
						return string(s) + ", " + step + fmt.Sprintf(", claim %s own=%v, ahead=%v", c, own, ahead)
					}
					in := billing.DeferredInput{Claim: c, Own: own, Ahead: ahead}
					// deferSQL: stored while another's claim is unsettled or
					// blocked, its own is blocked, or an event is ahead.
					held := ahead || !own && (c == billing.ClaimPending || c == billing.ClaimParked || c == billing.ClaimBlocked) ||
						own && c == billing.ClaimBlocked
					want, effects := s, []billing.DeferredEffect(nil)
					if held {
						want, effects = billing.DeferredWaiting, store
						if c == billing.ClaimBlocked {
							want = billing.DeferredHeld
						}
						if s == billing.DeferredLeased {
							want = s
						}
					}
					in.Step = billing.StepDefer
					checkDeferred(t, name("defer"), s, in, want, effects)
					in.Stored = true
					checkDeferred(t, name("defer, stored already"), s, in, s, []billing.DeferredEffect{billing.DeferredCommit})
					in.Stored = false

					// takeDeferredSQL: free of blocked claims, of another's
					// unsettled one, of its own parked one, of rows ahead.
					free := !ahead && c != billing.ClaimBlocked && !(c == billing.ClaimPending && !own) && c != billing.ClaimParked
					for _, over := range []bool{false, true} {
						in.Step, in.LeaseOver = billing.StepTake, over
						want, effects := s, []billing.DeferredEffect(nil)
						if free && s != billing.DeferredNone && (s != billing.DeferredLeased || over) {
							want, effects = billing.DeferredLeased, []billing.DeferredEffect{billing.DeferredLease}
						}
						checkDeferred(t, name(fmt.Sprintf("take, lease over=%v", over)), s, in, want, effects)
					}
					in.LeaseOver = false

					// A decision moves only a leased row, whatever the order.
					for d, w := range map[billing.Decision]struct {
						next billing.DeferredState
						e    billing.DeferredEffect
					}{
						billing.DecisionDurable:        {billing.DeferredNone, billing.DeferredFinish},
						billing.DecisionGiveBack:       {billing.DeferredWaiting, billing.DeferredRetry},
						billing.DecisionGiveBackUnsent: {billing.DeferredWaiting, billing.DeferredRetryNow},
						billing.DecisionLeave:          {billing.DeferredLeased, 0},
					} {
						in.Step, in.Decision = billing.StepDecided, d
						want, effects := s, []billing.DeferredEffect(nil)
						if s == billing.DeferredLeased {
							want = w.next
							if w.e != 0 {
								effects = []billing.DeferredEffect{w.e}
							}
						}
						checkDeferred(t, name(fmt.Sprintf("decided %d", d)), s, in, want, effects)
					}
				}
			}
		}
	}
}

func checkDeferred(t *testing.T, name string, s billing.DeferredState, in billing.DeferredInput, want billing.DeferredState, effects []billing.DeferredEffect) {
	t.Helper()
	got, e := s.Next(in)
	if got != want || !slices.Equal(e, effects) {
		t.Errorf("%s: %s, %v; want %s, %v", name, got, e, want, effects)
	}
}

// TestClaimStateNextAllocatesNothing: Next runs per event on the healthy
// path (the send decision, the 2xx's record, park), so none of its sender
// rows may allocate: every state a sender may find, every actor, answer,
// park, pause and block-after case.
func TestClaimStateNextAllocatesNothing(t *testing.T) {
	var inputs []billing.ClaimInput
	for _, actor := range []billing.Actor{billing.ActorCreator, billing.ActorEvent, billing.ActorCompleter, billing.ActorStray} {
		for _, ans := range []billing.Answer{billing.AnswerNone, billing.AnswerCharged, billing.AnswerRefused, billing.AnswerConflict, billing.AnswerUnknown} {
			for _, park := range []bool{false, true} {
				for _, paused := range []bool{false, true} {
					for _, age := range []time.Duration{0, 2 * time.Hour} {
						inputs = append(inputs, billing.ClaimInput{Actor: actor, Answer: ans, Park: park, Paused: paused, Age: age, BlockAfter: time.Hour})
					}
				}
			}
		}
	}
	states := []billing.ClaimState{billing.ClaimPending, billing.ClaimParked, billing.ClaimBlocked, billing.ClaimCharged, billing.ClaimReleased}
	for _, s := range states {
		for _, in := range inputs {
			var effects []billing.Effect
			allocs := testing.AllocsPerRun(20, func() { _, effects, _ = s.Next(in) })
			if allocs != 0 {
				t.Errorf("%s.Next(actor %d, answer %d, park %v, paused %v, age %v) = %v allocates %v times a call; want 0",
					s, in.Actor, in.Answer, in.Park, in.Paused, in.Age, effects, allocs)
			}
		}
	}
}
