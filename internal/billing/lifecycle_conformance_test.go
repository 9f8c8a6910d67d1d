package billing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// The conformance test (SPEC §11; issue 29, item 2). The model checker
// takes the statements' guards on trust, written as functions: the rules'
// mayDefer, mayTake, mayRelease and heldByDeferred, the steps' ownPending,
// owns and parkable, and the operator's transition and operatorMay. Here
// every mutating statement runs on a real Postgres from every starting row
// of one order with two events, a and b, and what it did — whether it
// changed or returned a row, and the rows it left — is compared with what
// the guard says and the model's step sets.
//
// A statement stricter than its guard would only mean that the model
// explores moves the service never makes; there is none today, and any
// such difference fails the test too, so that it is looked at. A statement
// more permissive than its guard is a move the model never explores: a gap
// in what the model proves.

// confGroup is the consumer group of the deferred rows.
const confGroup = "conformance"

// confDB is a transaction or the pool.
type confDB interface {
	TestDB
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// confWorlds are the starting rows: no claim, or a claim of a or b that is
// pending, blocked or charged, parked or not, sent by another attempt or
// not, young or past block-after, carrying the claim token of a running
// consumer attempt, a running deciding-loop attempt or of none; deferred
// rows of neither, one or both events, in either order; b of a's amount or
// of another. A charged claim is never parked in the model (the record
// clears it), so those rows are left out. Without deferred rows, each also
// with a's dead_letter row and record count as confDecisions lists them.
func confWorlds() []world {
	claims := []claimM{{}}
	for owner := range int8(2) {
		for _, st := range []mstatus{mPending, mBlocked, mCharged} {
			for _, parked := range []bool{false, true} {
				if st == mCharged && parked {
					continue
				}
				for _, others := range []bool{false, true} {
					for _, old := range []bool{false, true} {
						for creator := range int8(3) {
							claims = append(claims, claimM{exists: true, owner: owner, creator: creator, status: st,
								parked: parked, othersSent: others, old: old})
						}
					}
				}
			}
		}
	}
	var out []world
	for amountB := range int8(2) {
		for _, c := range claims {
			for _, order := range [][]int8{nil, {0}, {1}, {0, 1}, {1, 0}} {
				w := world{n: 2, claim: c}
				w.ev[1].amount = amountB
				for rank, i := range order {
					w.ev[i].deferred = int8(rank + 1)
				}
				out = append(out, w)
				for _, d := range confDecisions {
					if order == nil {
						w.ev[0].decision, w.ev[0].decidedAt, w.ev[0].replays = d[0], int8(d[1]), int8(d[2])
						out = append(out, w)
					}
				}
			}
		}
	}
	return out
}

// confDecisions are a's dead_letter rows (decision, its count) and the
// count of the record a's statements run for: a decision of a record
// replayed as often, less or more, one a replay's claim spent, and none.
var confDecisions = [][3]uint8{
	{dlqPermanent, 0, 0}, {dlqPermanent, 0, 1}, {dlqPermanent, 1, 1}, {dlqPermanent, 1, 0},
	{decisionSpent, 1, 0}, {decisionSpent, 1, 1}, {decisionSpent, 1, 2}, {0, 0, 1},
}

// confHasDecision: w has a dead_letter row or a replayed record.
func confHasDecision(w world) bool {
	for i := range w.n {
		if w.ev[i].decision != 0 || w.ev[i].replays != 0 {
			return true
		}
	}
	return false
}

// confReasons are the dead_letter reasons of the model's decisions.
var confReasons = map[uint8]string{dlqConflict: "conflict", dlqPermanent: "permanent", dlqExhausted: "exhausted", decisionSpent: ReplayedReason}

// confRecord is event i's record: the one its deferred row holds, or a
// fresh one (another offset: a replayed dead letter).
func confRecord(i int8, fresh bool) Record {
	off := int64(10 + i)
	if fresh {
		off += 100
	}
	return Record{Topic: "orders", Offset: off, Value: []byte{'a' + byte(i)}}
}

// confReset replaces the order's rows by w's: the claim as w.row() reads
// it (its age by the database's clock), and the deferred rows in w's
// order, and a stray charge of the other event for each of the claim's
// strays. decideAfter is the claim's decide_after from now (negative: past).
func confReset(ctx context.Context, db confDB, w world, decideAfter time.Duration) error {
	if _, err := db.Exec(ctx, `DELETE FROM charge; DELETE FROM deferred_event; DELETE FROM claim_send; DELETE FROM claim_audit;
DELETE FROM stray_charge; DELETE FROM dead_letter`); err != nil {
		return err
	}
	for i := range w.n {
		if d := w.ev[i].decision; d != 0 {
			ev := w.modelEvent(i)
			_, err := db.Exec(ctx, `INSERT INTO dead_letter (event_id, consumer_group, order_id, customer_id, amount, reason, replay_count, error)
VALUES ($1, $2, $3, $4, $5::numeric, $6, $7, 'model')`,
				[16]byte(modelID(i)), confGroup, ev.OrderID, ev.CustomerID, ev.TotalAmount.String(), confReasons[d], w.ev[i].decidedAt)
			if err != nil {
				return fmt.Errorf("insert the dead_letter row of %s: %w", eventNames[i], err)
			}
		}
	}
	for range w.claim.strays {
		_, err := db.Exec(ctx, `INSERT INTO stray_charge (order_id, event_id, provider_charge_id, sender, claim_event_id, claim_status)
VALUES (1, $1, 'ch_stray', 'creator', NULL, NULL)`, [16]byte(modelID(1-w.claim.owner)))
		if err != nil {
			return fmt.Errorf("insert a stray charge: %w", err)
		}
	}
	if row, ok := w.row(); ok {
		_, err := db.Exec(ctx, `INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status,
  claim_token, provider_charge_id, parked_at, next_send_at, others_sent_at, in_flight_until, decide_after, claimed_by)
VALUES ($1, $2, $3, $4::numeric, now() - $5 * interval '1 microsecond', now(), $6, $7,
  CASE WHEN $6 = 'charged' THEN 'ch_model' END, CASE WHEN $8 THEN now() END, CASE WHEN $8 THEN now() END,
  CASE WHEN $9 THEN now() END, now() + $10 * interval '1 microsecond', now() + $10 * interval '1 microsecond', 'conformance')`,
			row.OrderID, [16]byte(row.EventID), row.CustomerID, row.Amount.String(), row.Age.Microseconds(), row.Status.column(),
			[16]byte(row.Attempt), w.claim.parked, w.claim.othersSent, decideAfter.Microseconds())
		if err != nil {
			return fmt.Errorf("insert the claim: %w", err)
		}
	}
	for rank := int8(1); rank <= w.lastDeferred(); rank++ {
		for i := range w.n {
			if w.ev[i].deferred != rank {
				continue
			}
			rec := confRecord(i, false)
			_, err := db.Exec(ctx, `INSERT INTO deferred_event (consumer_group, event_id, order_id, waits_for, topic,
  kafka_partition, kafka_offset, record_value, header_key_bytes) VALUES ($1, $2, 1, $3, $4, $5, $6, $7, '{}')`,
				confGroup, [16]byte(modelID(i)), [16]byte(modelID(1-i)), rec.Topic, rec.Partition, rec.Offset, rec.Value)
			if err != nil {
				return fmt.Errorf("insert the deferred row of %s: %w", eventNames[i], err)
			}
		}
	}
	return nil
}

// confObserve reads the order's rows back into a copy of w: the claim,
// the deferred rows' order (one query) and the dead_letter rows. extra
// says what the model cannot hold: a second deferred row of an event.
func confObserve(ctx context.Context, db confDB, w world) (_ world, extra string, _ error) {
	n := w
	n.claim = claimM{held: w.claim.held, strays: w.claim.strays}
	var id, token *[16]byte
	var status *string
	var parked, others, old *bool
	var ids [][16]byte
	err := db.QueryRow(ctx, `SELECT c.event_id, c.status, c.claim_token, c.parked_at IS NOT NULL, c.others_sent_at IS NOT NULL,
  c.claimed_at < now() - interval '1 hour',
  (SELECT coalesce(array_agg(d.event_id ORDER BY d.seq), '{}') FROM deferred_event d WHERE d.consumer_group = $1 AND d.order_id = 1)
FROM (SELECT 1) AS one LEFT JOIN charge c ON c.order_id = 1`, confGroup).Scan(&id, &status, &token, &parked, &others, &old, &ids)
	if err != nil {
		return n, "", fmt.Errorf("read the rows: %w", err)
	}
	if id != nil {
		n.claim.exists, n.claim.owner, n.claim.creator = true, -1, -1
		n.claim.status, n.claim.parked, n.claim.othersSent, n.claim.old = mstatusOf(ClaimState(*status)), *parked, *others, *old
		for i := range w.n {
			if *id == modelID(i) {
				n.claim.owner = i
			}
		}
		for c := range int8(3) {
			if token != nil && *token == modelToken(n.claim.owner, c-1) {
				n.claim.creator = c
			}
		}
	}
	for i := range w.n {
		n.ev[i].deferred = 0
	}
	for k, e := range ids {
		for i := range w.n {
			if e != modelID(i) {
				continue
			}
			if n.ev[i].deferred != 0 {
				extra = "; a second deferred row of " + eventNames[i] + " (the model keeps one per event)"
				continue
			}
			n.ev[i].deferred = int8(k + 1)
		}
	}
	return confObserveDecisions(ctx, db, n, extra)
}

// confObserveDecisions reads the dead_letter rows back into n.
func confObserveDecisions(ctx context.Context, db confDB, n world, extra string) (world, string, error) {
	for i := range n.n {
		n.ev[i].decision, n.ev[i].decidedAt = 0, 0
		var reason string
		var count int8
		err := db.QueryRow(ctx, `SELECT reason, replay_count FROM dead_letter WHERE event_id = $1 AND consumer_group = $2`,
			[16]byte(modelID(i)), confGroup).Scan(&reason, &count)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return n, "", fmt.Errorf("read the dead_letter row of %s: %w", eventNames[i], err)
		}
		n.ev[i].decidedAt = count
		for bit, name := range confReasons {
			if name == reason {
				n.ev[i].decision = bit
			}
		}
	}
	return n, extra, nil
}

// confComparable is w as the test compares it: a charged claim's parked
// flag is no state (the record leaves parked_at, and every statement reads
// it of a pending claim only), and the deferred rows are ranked 1..k.
func confComparable(w world) world {
	if w.claim.status == mCharged {
		w.claim.parked = false
	}
	w.normalize()
	return w
}

// confCase is one statement run for one event (or none). model says
// whether the statement's guard allows it, the world the model's step
// leaves and what it answers beside the row (the event taken, the claim's
// lookup); run carries the statement out in tx (s runs on tx) and answers
// whether it changed or returned a row, and what beside.
type confCase struct {
	name  string
	model func(r modelRules, w world) (bool, world, string)
	run   func(ctx context.Context, s *Service, tx pgx.Tx, w world) (bool, string, error)
	// body: the statement is given the event's body (customer, amount),
	// so it runs also with b of another amount than a; the others are
	// given ids alone and read no amount.
	body bool
	// decisions: the statement reads or writes dead_letter; the others run
	// only from the starting rows without a decision or a replayed record.
	decisions bool
	// looser says where the model may make a move the statement refuses,
	// and why that proves no less (nil: nowhere).
	looser func(w world) bool
	why    string
}

// confCases are the statements the model has a guard for, each for a
// and for b (and each of their actors).
func confCases() []confCase {
	cs := []confCase{{name: "takeDeferredSQL", model: confTakeModel, run: confTake}}
	for i := range int8(2) {
		name := eventNames[i]
		for _, fresh := range []bool{false, true} {
			label := name + ", the record of its deferred row (a redelivery)"
			if fresh {
				label = name + ", a record at another offset (a replayed dead letter)"
			}
			cs = append(cs, confCase{name: "deferSQL: " + label,
				model: func(r modelRules, w world) (bool, world, string) {
					ok := r.mayDefer(w, i)
					if ok && w.ev[i].deferred == 0 {
						w.ev[i].deferred = w.lastDeferred() + 1
					}
					return ok, w, ""
				},
				run: func(ctx context.Context, s *Service, _ pgx.Tx, w world) (bool, string, error) {
					ok, err := s.Defer(ctx, w.modelEvent(i), confRecord(i, fresh))
					return ok, "", err
				},
				looser: func(w world) bool { return fresh && w.ev[i].deferred != 0 },
				why:    "the model lets the event's row stand for any record of it, a replayed one too, which deferSQL stores only while the order is held"})
		}
		cs = append(cs, confCase{name: "parkSQL: " + name,
			model: func(r modelRules, w world) (bool, world, string) {
				ok := parkable(w, i)
				if ok {
					w.claim.parked, w.claim.othersSent = true, true
					r.parkKeeps(&w, i, w.ev[i].replays)
				}
				return ok, w, ""
			},
			run: func(ctx context.Context, s *Service, _ pgx.Tx, w world) (bool, string, error) {
				ok, err := s.Park(ctx, w.modelEvent(i), confRecord(i, false))
				return ok, "", err
			},
			body: true})
		cs = append(cs, confCase{name: "blockSQL: " + name,
			model: func(_ modelRules, w world) (bool, world, string) {
				ok := ownPending(w.claim, i)
				if ok {
					w.claim.status = mBlocked
				}
				return ok, w, ""
			},
			run: func(ctx context.Context, s *Service, _ pgx.Tx, _ world) (bool, string, error) {
				n, err := s.store.BlockClaims(ctx, []int64{1}, []uuid.UUID{modelID(i)}, "conformance")
				return n == 1, "", err
			}})
		cs = append(cs, confCase{name: "recordSQL: " + name,
			model: func(_ modelRules, w world) (bool, world, string) {
				ok := owns(w.claim, i)
				if ok {
					w.claim.status, w.claim.parked = mCharged, false
				}
				return ok, w, ""
			},
			run: func(ctx context.Context, s *Service, _ pgx.Tx, _ world) (bool, string, error) {
				return confMarkCharged(ctx, s, modelID(i))
			}})
		for _, sender := range []string{SenderCreator, SenderRedelivery, SenderCompleter} {
			cs = append(cs, confCase{name: "markSentSQL: " + name + " by the " + sender,
				model: func(_ modelRules, w world) (bool, world, string) {
					ok := ownPending(w.claim, i)
					if ok && sender != SenderCreator {
						w.claim.othersSent = true
					}
					return ok, w, ""
				},
				run: func(ctx context.Context, s *Service, tx pgx.Tx, _ world) (bool, string, error) {
					sent, err := markSent(ctx, s.store, s.dbTimeout, s.sends, []int64{1}, []uuid.UUID{modelID(i)}, []string{sender})
					return sent[modelID(i)], "", err
				}})
		}
		for _, by := range []int8{byConsumer, byDecider} {
			cs = append(cs, confCase{name: fmt.Sprintf("releaseSQL: %s by its attempt %d", name, by),
				model: func(r modelRules, w world) (bool, world, string) {
					ok := r.mayRelease(w.claim, i, by)
					if ok {
						w.claim = claimM{}
					}
					return ok, w, ""
				},
				run: func(ctx context.Context, s *Service, _ pgx.Tx, _ world) (bool, string, error) {
					released, err := s.store.ReleaseClaims(ctx, []int64{1}, []uuid.UUID{modelID(i)}, []uuid.UUID{modelToken(i, by)})
					return len(released) == 1, "", err
				}})
		}
		cs = append(cs, confCase{name: "claimSQL: " + name,
			model: func(r modelRules, w world) (bool, world, string) { return confClaimModel(r, w, i) },
			run: func(ctx context.Context, s *Service, _ pgx.Tx, w world) (bool, string, error) {
				return confClaim(ctx, s, w, i)
			},
			body: true, decisions: true})
		cs = append(cs, confCase{name: "recordDeadLetterSQL: " + name + ", exhausted",
			model: func(r modelRules, w world) (bool, world, string) {
				count := recordOf(w, i, byConsumer)
				if kept := r.keeps(w, i, count); kept != 0 {
					return false, w, confReasons[kept]
				}
				w.ev[i].decision, w.ev[i].decidedAt = dlqExhausted, max(w.ev[i].decidedAt, count)
				return true, w, "exhausted"
			},
			run: func(ctx context.Context, s *Service, _ pgx.Tx, w world) (bool, string, error) {
				reason, cause, err := s.RecordDeadLetter(ctx, w.modelEvent(i), int(w.ev[i].replays), "exhausted", "conformance")
				return reason == "exhausted" && cause == "conformance", reason, err
			},
			body: true, decisions: true})
	}
	return cs
}

// confMarkCharged marks the claim of event id charged (Tx.MarkCharged, in
// a transaction nested in the case's) and answers whether it marked one.
func confMarkCharged(ctx context.Context, s *Service, id uuid.UUID) (bool, string, error) {
	tx, err := s.store.Begin(ctx)
	if err != nil {
		return false, "", err
	}
	defer tx.Rollback(ctx)
	marked, err := tx.MarkCharged(ctx, []int64{1}, []uuid.UUID{id}, []string{"ch_conformance"}, time.Now())
	if err != nil {
		return false, "", err
	}
	return len(marked) == 1, "", tx.Commit(ctx)
}

// confTakeModel: the deciding loop may take the deferred rows mayTake
// allows (at most one: the others are behind it).
func confTakeModel(r modelRules, w world) (bool, world, string) {
	var names []string
	for i := range w.n {
		if w.ev[i].deferred != 0 && r.mayTake(w, i) {
			names = append(names, eventNames[i])
		}
	}
	return len(names) > 0, w, strings.Join(names, ",")
}

func confTake(ctx context.Context, s *Service, _ pgx.Tx, _ world) (bool, string, error) {
	d, ok, err := s.TakeDeferred(ctx, time.Minute)
	if !ok || err != nil {
		return false, "", err
	}
	for i := range int8(2) {
		if d.EventID == modelID(i) {
			return true, eventNames[i], nil
		}
	}
	return true, "another event", nil
}

// confClaimModel: the claim statement answers event i's record with the
// stored decision (decided); else it spends an older one (spends), and
// inserts i's claim when the order has none and no event deferred before
// i holds it; else the model's claim step decides by decide over w.row(),
// or waits (held).
func confClaimModel(r modelRules, w world, i int8) (bool, world, string) {
	count := recordOf(w, i, byConsumer)
	if reason := r.decided(w, i, count); reason != 0 {
		return false, w, "dead-lettered before: " + confReasons[reason]
	}
	r.spends(&w, i, count)
	if !w.claim.exists {
		if r.heldByDeferred(w, i) {
			return false, w, "held by a deferred event"
		}
		w.claim = claimM{exists: true, owner: i, creator: byConsumer + 1, status: mPending}
		return true, w, ""
	}
	row, _ := w.row()
	return false, w, confDecision(r.decide(row, true, w.modelEvent(i), modelBlockAfter))
}

// confClaim runs claimSQL (Store.ClaimOrders) for event i's consumer
// attempt and, when it claims nothing, the lookup that follows it
// (lookupSQL, heldSQL) and decide over the row the database gave.
func confClaim(ctx context.Context, s *Service, w world, i int8) (bool, string, error) {
	ev := w.modelEvent(i)
	answers, err := s.store.ClaimOrders(ctx, s.group, s.sends, []NewClaim{{OrderID: ev.OrderID, EventID: ev.EventID,
		CustomerID: ev.CustomerID, Amount: ev.TotalAmount, Attempt: modelToken(i, byConsumer), ReplayCount: int(w.ev[i].replays)}})
	if err != nil {
		return false, "", err
	}
	if len(answers) == 1 && answers[0].Decided {
		return false, "dead-lettered before: " + answers[0].Reason, nil
	}
	if won := len(answers) == 1; won {
		return true, "", nil
	}
	l, err := s.lookup(ctx, []events.OrderConfirmed{ev}, []int{0})
	if err != nil {
		return false, "", err
	}
	row, found := l.forEvent(ev)
	if !found {
		if _, held := l.heldBy[ev.EventID]; held {
			return false, "held by a deferred event", nil
		}
		return false, "no row, not held: claimSQL refused for no reason", nil
	}
	return false, confDecision(decide(row, true, ev, s.claimBlockAfter)), nil
}

func confDecision(v verdict, o Outcome, err error) string {
	return fmt.Sprintf("verdict %d, outcome %q, %s, held %v", v, o, fault.KindOf(err), errors.Is(err, ErrHeld))
}

// confMismatches collects the differences of each statement from its
// guard, reported a few at a time.
type confMismatches map[string][]string

func (m confMismatches) add(name, format string, args ...any) {
	m[name] = append(m[name], fmt.Sprintf(format, args...))
}

func (m confMismatches) report(t *testing.T) {
	t.Helper()
	for name, all := range m {
		t.Errorf("%s: %d starting rows where the statement and the model's guard differ, e.g.:\n  %s",
			name, len(all), strings.Join(all[:min(len(all), 3)], "\n  "))
	}
}

// compare records how the statement's (got, detail, after) differs from
// the model's (want, wantDetail, wantAfter), from w.
func (m confMismatches) compare(name string, w world, got bool, detail string, after world, want bool, wantDetail string, wantAfter world) {
	switch {
	case got && !want:
		m.add(name, "MORE PERMISSIVE than the model (a move the model never explores) from %s", w.show())
	case !got && want:
		m.add(name, "stricter than the model (it refuses a move the model makes) from %s", w.show())
	case detail != wantDetail:
		m.add(name, "answered %q, the model %q, from %s", detail, wantDetail, w.show())
	case confComparable(after) != confComparable(wantAfter):
		m.add(name, "left %s\n    the model's step %s\n    from %s", after.show(), wantAfter.show(), w.show())
	}
}

// TestStatementsConformToTheModel runs every mutating statement the
// model has a guard for from every starting row (confWorlds), each in a
// transaction rolled back after it, and the operator's commands through
// ApplyOperator.
func TestStatementsConformToTheModel(t *testing.T) {
	pool := pgtest.NewPool(t)
	storeOn(t, pool) // the adapter is there
	ctx := context.Background()
	r := productionRules()
	worlds := confWorlds()
	t.Run("statements", func(t *testing.T) {
		cases := confCases()
		bad := confMismatches{}
		looser, refused, whys := map[string]int{}, map[string]int{}, map[string]string{}
		for _, w := range worlds {
			if err := confReset(ctx, pool, w, -time.Minute); err != nil {
				t.Fatalf("rows of %s: %v", w.show(), err)
			}
			for _, c := range cases {
				if w.ev[1].amount != 0 && !c.body || confHasDecision(w) && !c.decisions {
					continue
				}
				want, wantAfter, wantDetail := c.model(r, w)
				if c.looser != nil && want && c.looser(w) {
					// The model's move here is one the statement may
					// refuse (c.why): counted, and compared if it is made.
					looser[c.name]++
				}
				got, detail, after, err := confRun(ctx, pool, c, w)
				if err != nil {
					t.Fatalf("%s from %s: %v", c.name, w.show(), err)
				}
				if !got && want && c.looser != nil && c.looser(w) {
					refused[c.name]++
					whys[c.name] = c.why
					continue
				}
				bad.compare(c.name, w, got, detail, after, want, wantDetail, wantAfter)
			}
		}
		bad.report(t)
		for name, n := range refused {
			t.Logf("%s: stricter than the model from %d of the %d starting rows where it may be (%s)", name, n, looser[name], whys[name])
		}
		t.Logf("%d statements from %d starting rows", len(cases), len(worlds))
	})
	t.Run("operator", func(t *testing.T) {
		bad := confMismatches{}
		n := 0
		for _, w := range worlds {
			if w.ev[0].deferred != 0 || w.ev[1].deferred != 0 || w.ev[1].amount != 0 || confHasDecision(w) {
				continue // ApplyOperator reads none of them
			}
			for _, open := range []bool{false, true} {
				for _, act := range []OperatorAction{ActionRelease, ActionMarkCharged} {
					for strays := range int8(2) {
						if strays > 0 && !w.claim.exists {
							continue
						}
						w.claim.strays = strays
						name := fmt.Sprintf("ApplyOperator %s, in-flight window open %v, %d stray charge(s)", act, open, strays)
						got, after, err := confOperate(ctx, pool, w, act, open)
						if err != nil {
							t.Fatalf("%s from %s: %v", name, w.show(), err)
						}
						want, wantAfter := confOperatorModel(r, w, act, open)
						bad.compare(name, w, got, "", after, want, "", wantAfter)
						n++
					}
				}
			}
		}
		bad.report(t)
		t.Logf("%d operator commands", n)
	})
}

// confSvc is a Service whose statements run in tx.
func confSvc(tx pgx.Tx) *Service {
	return &Service{store: StoreOn(tx), group: confGroup, now: time.Now, logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		dbTimeout: 10 * time.Second, claimBlockAfter: modelBlockAfter, sends: SendConfig{Host: "conformance"}.withDefaults()}
}

// confRun runs c from w's rows (already in the database) in a
// transaction, reads the rows it left and rolls it back.
func confRun(ctx context.Context, pool *pgxpool.Pool, c confCase, w world) (bool, string, world, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, "", w, err
	}
	defer tx.Rollback(ctx)
	got, detail, err := c.run(ctx, confSvc(tx), tx, w)
	if err != nil {
		return false, "", w, err
	}
	after, extra, err := confObserve(ctx, tx, w)
	return got, detail + extra, after, err
}

// confOperatorModel is the model's operator step from w, with a recorded
// request of the claim still at the provider when open (the claim's
// decide_after not reached): whether operatorMay and the operator's
// transition allow act, and the world after.
func confOperatorModel(r modelRules, w world, act OperatorAction, open bool) (bool, world) {
	c := w.claim
	if !c.exists {
		return false, w
	}
	mw := w
	if open {
		mw.ev[c.owner].orphans[1] = 1
	}
	if !r.operatorMay(mw) {
		return false, w
	}
	next, _, err := r.next(c.state(), ClaimInput{Actor: ActorOperator, Operator: operatorMove(confOperatorRequest(act), c)})
	if err != nil {
		return false, w
	}
	if next == ClaimReleased {
		w.claim = claimM{}
	} else {
		w.claim.status = mstatusOf(next)
	}
	return true, w
}

// confOperatorRequest is the request the model's operator makes.
func confOperatorRequest(act OperatorAction) OperatorRequest {
	req := OperatorRequest{OrderID: 1, Action: act, Operator: "model", Reason: "runbook", ProviderHoldsNoCharge: act == ActionRelease}
	if act == ActionMarkCharged {
		req.ChargeID = "ch_model"
	}
	return req
}

// confOperate runs act through ApplyOperator from w's rows, the claim's
// decide_after an hour ahead when open, a minute past otherwise; it
// answers whether the command changed the claim, and the rows it left.
func confOperate(ctx context.Context, pool *pgxpool.Pool, w world, act OperatorAction, open bool) (bool, world, error) {
	decideAfter := -time.Minute
	if open {
		decideAfter = time.Hour
	}
	if err := confReset(ctx, pool, w, decideAfter); err != nil {
		return false, w, err
	}
	_, err := ApplyOperator(ctx, StoreOn(pool), slog.New(slog.NewTextHandler(io.Discard, nil)), confOperatorRequest(act))
	if err != nil && !errors.Is(err, ErrUnsafe) && !errors.Is(err, ErrNoClaim) {
		return false, w, err
	}
	after, _, oerr := confObserve(ctx, pool, w)
	return err == nil, after, oerr
}
