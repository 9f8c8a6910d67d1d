package postgres

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/billing-consumer/billing-consumer/internal/heal"
)

// healQuerier is what the heal's statements need: a connection (in pgx's
// AfterConnect) or the pool (the watch loop).
type healQuerier interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// HealStore is the heal's gate (heal_range, migration 00014) and the
// positions it compares, for one group and topic. It implements
// heal.Store.
type HealStore struct {
	DB           healQuerier
	Group, Topic string
}

// NewHealStore is the HealStore of group and topic on db.
func NewHealStore(db *DB, group, topic string) HealStore {
	return HealStore{DB: db.pool, Group: group, Topic: topic}
}

// HealOnConnect returns the pool's AfterConnect (Open's WithHeal): h's check on the new
// connection, before pgx hands it to anyone (docs/design.md, "The heal").
// The server's identity is its postmaster's start time: a promoted
// standby, a restored backup and a restarted server each have another.
// A schema without heal_range (behind this binary: the schema guard
// refuses to bill) is not checked.
func HealOnConnect(h *heal.Healer, group, topic string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		var server string
		// The epoch, not the text: that is in the session's time zone.
		if err := conn.QueryRow(ctx, `SELECT extract(epoch FROM pg_postmaster_start_time())::text`).Scan(&server); err != nil {
			return fmt.Errorf("failover heal check: the database server's identity: %w", err)
		}
		err := h.Check(ctx, HealStore{DB: conn, Group: group, Topic: topic}, server)
		if UndefinedTable(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("failover heal check, made before a new database connection is used: %w", err)
		}
		return nil
	}
}

const gateSQL = `SELECT partition, lo, hi, committed, coalesce(position, -1) FROM heal_range
WHERE consumer_group = $1 AND topic = $2 AND lifted_at IS NULL`

// Gate returns the ranges of the heal that is up, nil when none is.
func (s HealStore) Gate(ctx context.Context) (map[int]heal.Range, error) {
	return gate(ctx, s.DB, s.Group, s.Topic)
}

func gate(ctx context.Context, q querier, group, topic string) (map[int]heal.Range, error) {
	rows, err := q.Query(ctx, gateSQL, group, topic)
	if err != nil {
		return nil, fmt.Errorf("read the heal gate of %s/%s: %w", group, topic, err)
	}
	var out map[int]heal.Range
	var part int32
	var r heal.Range
	if _, err := pgx.ForEachRow(rows, []any{&part, &r.Lo, &r.Hi, &r.Committed, &r.Position}, func() error {
		if out == nil {
			out = map[int]heal.Range{}
		}
		out[int(part)] = r
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read the heal gate of %s/%s: %w", group, topic, err)
	}
	return out, nil
}

// Positions returns the positions by partition.
func (s HealStore) Positions(ctx context.Context) (map[int]int64, error) {
	rows, err := s.DB.Query(ctx, `SELECT partition, next_offset FROM consumer_position
WHERE consumer_group = $1 AND topic = $2`, s.Group, s.Topic)
	if err != nil {
		return nil, fmt.Errorf("read positions of %s/%s: %w", s.Group, s.Topic, err)
	}
	out := map[int]int64{}
	var part int32
	var next int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &next}, func() error {
		out[int(part)] = next
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read positions of %s/%s: %w", s.Group, s.Topic, err)
	}
	return out, nil
}

// healHoldSQL blocks the given surviving pending claims (parked or not):
// see holds. It is the transition a claim takes at
// BILLING_CLAIM_BLOCK_AFTER (pending to blocked, sends kept, so a late 2xx
// still marks it charged); its last_error says why.
const healHoldSQL = `UPDATE charge c SET status = 'blocked', last_error = t.why
FROM unnest($1::bigint[], $2::text[]) AS t(o, why)
WHERE c.order_id = t.o AND c.status = 'pending'`

// healBlockSQL gives each suspect order without a claim row a 'blocked'
// claim in its first event's name (see heal.Suspect): its events are
// then deferred behind it until an operator settles it (SPEC §11 I3).
const healBlockSQL = `INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status,
  claim_token, last_error, claimed_by)
SELECT t.o, t.e, t.c, t.a::numeric, now(), now(), 'blocked', gen_random_uuid(), t.why, 'failover heal'
FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::text[], $5::text[]) AS t(o, e, c, a, why)
WHERE NOT EXISTS (SELECT 1 FROM charge WHERE order_id = t.o)
ORDER BY t.o
ON CONFLICT DO NOTHING`

// windowSQL gives every unsettled claim (the heal's blocked ones
// included) an in-flight window from now: see heal.Window.
const windowSQL = `UPDATE charge SET in_flight_until = greatest(in_flight_until, now() + $1::bigint * interval '1 millisecond'),
  decide_after = greatest(decide_after, now() + $2::bigint * interval '1 millisecond')
WHERE status <> 'charged'`

const insertRangeSQL = `INSERT INTO heal_range (consumer_group, topic, partition, lo, hi, committed, position, started_by, blocked_orders)
SELECT $1, $2, t.p, t.lo, t.hi, t.c, nullif(t.pos, -1), $8, $9
FROM unnest($3::int[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[]) AS t(p, lo, hi, c, pos)`

// Install installs the gate, or returns the one that is up (see
// heal.Store). The transaction-scoped advisory lock makes replicas that
// found the same loss at once install it once.
func (s HealStore) Install(ctx context.Context, ranges map[int]heal.Range, suspects []heal.Suspect, by string, w heal.Window) (map[int]heal.Range, int, bool, error) {
	var (
		up      map[int]heal.Range
		blocked int
	)
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('billing-consumer heal ' || $1 || '/' || $2, 0))`,
			s.Group, s.Topic); err != nil {
			return err
		}
		var err error
		if up, err = gate(ctx, tx, s.Group, s.Topic); err != nil || up != nil {
			return err
		}
		if blocked, err = block(ctx, tx, suspects); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, windowSQL, w.Deadline.Milliseconds(), (w.Deadline + w.ProviderBound).Milliseconds()); err != nil {
			return fmt.Errorf("renew the in-flight windows of the unsettled claims: %w", err)
		}
		ids := slices.Sorted(maps.Keys(ranges))
		var parts []int32
		var lo, hi, com, pos []int64
		for _, id := range ids {
			r := ranges[id]
			parts, lo, hi, com, pos = append(parts, int32(id)), append(lo, r.Lo), append(hi, r.Hi), append(com, r.Committed), append(pos, r.Position)
		}
		_, err = tx.Exec(ctx, insertRangeSQL, s.Group, s.Topic, parts, lo, hi, com, pos, by, blocked)
		return err
	})
	if err != nil {
		return nil, 0, false, err
	}
	if up != nil {
		return up, 0, false, nil
	}
	return ranges, blocked, true, nil
}

// block inserts the suspects' blocked claims, blocks the surviving
// pending claims holds picks, and returns how many orders it blocked.
func block(ctx context.Context, tx pgx.Tx, suspects []heal.Suspect) (int, error) {
	if len(suspects) == 0 {
		return 0, nil
	}
	orders, customers := make([]int64, len(suspects)), make([]int64, len(suspects))
	evs := make([][16]byte, len(suspects))
	amounts, whys := make([]string, len(suspects)), make([]string, len(suspects))
	for i, s := range suspects {
		orders[i], evs[i], customers[i], amounts[i] = s.OrderID, s.First.EventID, s.First.CustomerID, s.First.Amount.String()
		ids := make([]string, len(s.EventIDs))
		for j, id := range s.EventIDs {
			ids[j] = id.String()
		}
		whys[i] = "failover heal: events " + strings.Join(ids, ", ") + " of this order fell in the records whose decisions " +
			"the database lost; which one the provider charged is not known here: look each key up at the provider " +
			"(docs/operations.md, \"After a failover\")"
	}
	heldOrders, heldWhys, err := holds(ctx, tx, suspects, whys)
	if err != nil {
		return 0, err
	}
	held, err := tx.Exec(ctx, healHoldSQL, heldOrders, heldWhys)
	if err != nil {
		return 0, fmt.Errorf("block the surviving claims of the orders the heal cannot tell apart: %w", err)
	}
	tag, err := tx.Exec(ctx, healBlockSQL, orders, evs, customers, amounts, whys)
	if err != nil {
		return 0, fmt.Errorf("block the orders the heal cannot tell apart: %w", err)
	}
	return int(held.RowsAffected() + tag.RowsAffected()), nil
}

// holds picks the suspects whose surviving claim is pending and has two
// or more of the suspect's events other than its own waiting behind it:
// which of them the lost commits had decided, and in what order, is lost
// too (a surviving claim keeps no order of the events re-deferred behind
// it, and its release lets the first of them charge). With one waiter the
// order is the only one there is: the claim settles, then that event is
// decided, as the first time. It locks the claims it reads.
func holds(ctx context.Context, tx pgx.Tx, suspects []heal.Suspect, whys []string) ([]int64, []string, error) {
	orders := make([]int64, len(suspects))
	for i, s := range suspects {
		orders[i] = s.OrderID
	}
	rows, err := tx.Query(ctx, `SELECT order_id, event_id FROM charge WHERE order_id = ANY($1) AND status = 'pending'
ORDER BY order_id FOR UPDATE`, orders)
	if err != nil {
		return nil, nil, fmt.Errorf("read the surviving claims of the suspects: %w", err)
	}
	owner := map[int64][16]byte{}
	var order int64
	var ev [16]byte
	if _, err := pgx.ForEachRow(rows, []any{&order, &ev}, func() error { owner[order] = ev; return nil }); err != nil {
		return nil, nil, fmt.Errorf("read the surviving claims of the suspects: %w", err)
	}
	var held []int64
	var heldWhys []string
	for i, s := range suspects {
		own, ok := owner[s.OrderID]
		if !ok {
			continue
		}
		waiters := 0
		for _, id := range s.EventIDs {
			if [16]byte(id) != own {
				waiters++
			}
		}
		if waiters >= 2 {
			held, heldWhys = append(held, s.OrderID), append(heldWhys, whys[i])
		}
	}
	return held, heldWhys, nil
}

// liftSQL lifts the gate once every range's position has reached its
// target; a range with no position row has not.
const liftSQL = `UPDATE heal_range SET lifted_at = now()
WHERE consumer_group = $1 AND topic = $2 AND lifted_at IS NULL
AND NOT EXISTS (SELECT 1 FROM heal_range r LEFT JOIN consumer_position p
    ON p.consumer_group = r.consumer_group AND p.topic = r.topic AND p.partition = r.partition
  WHERE r.consumer_group = $1 AND r.topic = $2 AND r.lifted_at IS NULL AND coalesce(p.next_offset, -1) < r.hi)`

// Lift lifts the gate if every range has reached its target.
func (s HealStore) Lift(ctx context.Context) (bool, error) {
	tag, err := s.DB.Exec(ctx, liftSQL, s.Group, s.Topic)
	if err != nil {
		return false, fmt.Errorf("lift the heal gate of %s/%s: %w", s.Group, s.Topic, err)
	}
	return tag.RowsAffected() > 0, nil
}

// ErrHealing is returned by RefuseDuringHeal while a heal's gate is up.
var ErrHealing = errors.New("a failover heal is in progress (billing-consumer positions show lists its ranges): " +
	"run it again once the gate has lifted; acting now would decide an order before the records the database lost are re-decided")

// RefuseDuringHeal returns ErrHealing while a heal's gate is up for group
// (any topic): the operator's commands that settle or move what the heal
// re-decides (claim release and mark-charged, reconcile, positions
// accept) wait for the lift, as the service's own loops that bill do. A
// schema without heal_range has no heal.
func RefuseDuringHeal(ctx context.Context, db *DB, group string) error {
	var up bool
	err := db.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM heal_range WHERE consumer_group = $1 AND lifted_at IS NULL)`, group).Scan(&up)
	switch {
	case UndefinedTable(err):
		return nil
	case err != nil:
		return fmt.Errorf("read the failover heal's gate: %w", err)
	case up:
		return ErrHealing
	}
	return nil
}
