package postgres

// Store, billing's storage ports on Postgres (billing.Store and
// billing.OperatorStore): this file holds the ledger's claim statements;
// deferred.go the deferred events', parked claims' and dead letters';
// tx.go the transactions'; session.go the completer's session;
// operator.go the operator's commands.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/money"
	"github.com/billing-consumer/billing-consumer/internal/postgres/dedup"
)

// Conn is what the Store needs of Postgres: the *pgxpool.Pool inside a
// DB is one, and so is a pgx.Tx (the conformance test runs each statement
// in one it rolls back). Each call may run on a different connection.
type Conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Store implements billing.Store and billing.OperatorStore on db. Its
// statements run as given; the caller bounds them with ctx. Every error of
// billing.Store's methods and of their transactions carries a fault.Kind
// (classifyDB); the operator's errors are the database's as they are. It
// is safe for concurrent use when db is a pool.
type Store struct {
	db Conn
}

// NewStore returns the Store on db.
func NewStore(db *DB) *Store { return &Store{db: db.pool} }

// NewStoreOn returns the Store on c: a pool or a transaction its caller
// holds (tests, and tools that hold a pool).
func NewStoreOn(c Conn) *Store { return &Store{db: c} }

// The claim statements run outside any transaction: each commits on its
// own, before the provider is called. They sort their rows so concurrent
// claims lock ledger rows in one order.
//
// claimSQL does not claim an order that an event deferred before this one
// holds (deferred.go, aheadSQL; $6 is the consumer group): that event is
// decided first, and the lookup that follows says so (heldSQL).
//
// It records the creator's first send too (sends.go): $7 and $8 are D and
// D plus the provider's bound in milliseconds, $9 the replica.
//
// And it answers first the events whose dead letter is decided already
// (deadletter.go): a row of dead_letter of the same event and parameters
// (order, customer, amount: another record's conflict under a reused
// event_id never answers the valid event) whose replay_count is not below
// the record's ($10) and whose reason is a decision (not billing.ReplayedReason),
// unless the event's own claim is charged, returns the event with its
// stored reason and error, and the event is not claimed. The healthy path
// pays no statement for it: the claim's returned rows carry it (a NULL
// reason is a claim won). A replayed record (rp) leaves the row at its
// count with billing.ReplayedReason instead of a decision older than it, in the
// same statement as its claim: from then on no record of the event is
// answered by the spent dead letter, and the event's next dead letter,
// from any of its records, is stored at that count (recordDeadLetterSQL).
// rp takes its rows in event order, so that two claim statements lock
// dead_letter rows in one order (Postgres does not order ins and rp
// against each other: a deadlock across the two tables, which needs two
// batches replaying the same events at once, is a Transient error,
// retried; classify.go).
//
// The two checks are not gated by a test of whether their tables hold a
// row of the batch's keys, though on empty tables such a gate saved about
// 1 µs of Postgres's CPU per claim (issue 31): Postgres plans an EXISTS to
// stop at its first match, and where a few orders hold many deferred
// events, or a few events many dead letters, the gate read the whole
// table for each claim of the batch (hundreds of ms a statement, in the
// cached generic plan). The checks as they are read the indexes for the
// batch's keys only.
var (
	claimSQL = claimHead + claimReplayed + claimInsert
	// claimFreshSQL is claimSQL without rp, for a batch none of whose
	// records is a replay (every $10 is 0): rp inserts nothing then, and
	// its step cost about 6% of the statement's CPU in Postgres.
	claimFreshSQL = claimHead + claimInsert
)

// The steps of claimSQL.
var (
	claimHead = `WITH v AS (
  SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::text[], $5::uuid[], $10::int[]) WITH ORDINALITY AS v(o, e, c, a, t, r, n)),
dl AS (
  SELECT d.event_id, d.reason, d.error FROM v JOIN dead_letter d ON d.event_id = v.e AND d.consumer_group = $6
    AND d.order_id = v.o AND d.customer_id = v.c AND d.amount = v.a::numeric AND d.replay_count >= v.r
  WHERE d.reason <> '` + billing.ReplayedReason + `' AND NOT EXISTS (SELECT 1 FROM charge x WHERE x.event_id = v.e AND x.status = 'charged')),`
	claimReplayed = `rp AS (
  INSERT INTO dead_letter AS d (event_id, consumer_group, order_id, customer_id, amount, reason, replay_count, error)
  SELECT e, $6, o, c, a::numeric, '` + billing.ReplayedReason + `', r, '' FROM v WHERE r > 0 ORDER BY e
  ON CONFLICT (event_id, consumer_group, order_id, customer_id, amount) DO UPDATE
  SET reason = excluded.reason, replay_count = excluded.replay_count, error = '', decided_at = now()
  WHERE d.replay_count < excluded.replay_count),
`
	claimInsert = `ins AS (
  INSERT INTO charge (order_id, event_id, customer_id, amount, claimed_at, charged_at, status, claim_token,
    in_flight_until, decide_after, claimed_by)
  SELECT o, e, c, a::numeric, now(), now(), 'pending', t,
    now() + $7 * interval '1 millisecond', now() + $8 * interval '1 millisecond', $9
  FROM v
  WHERE NOT EXISTS (` + ahead("$6", "v.o", "v.e") + `) AND NOT EXISTS (SELECT 1 FROM dl WHERE dl.event_id = v.e)
  ORDER BY o, n
  ON CONFLICT DO NOTHING RETURNING event_id)
SELECT event_id, NULL::text, NULL::text FROM ins
UNION ALL SELECT event_id, reason, error FROM dl`
)

const (
	// lookupSQL returns the rows that stopped a claim: the order's row,
	// and the row of another order holding the event_id, if any.
	lookupSQL = `SELECT ` + claimColumns + ` FROM charge
WHERE order_id = ANY($1) OR event_id = ANY($2)`
	// claimColumns are the columns scanClaim reads; the last two are the
	// claim's age (ageColumn) and whether it is parked (claimStateOf).
	claimColumns = `order_id, event_id, customer_id, amount::text, status, claimed_at, claim_token, ` + ageColumn + `, parked_at IS NOT NULL`
	// ageColumn is a claim's age in microseconds by the database's clock.
	ageColumn = `(extract(epoch FROM now() - claimed_at) * 1000000)::bigint`
	// releaseSQL is the release rule on the row itself: only the creating
	// attempt's token, and only while no other attempt recorded a send.
	releaseSQL = `DELETE FROM charge c USING unnest($1::bigint[], $2::uuid[], $3::uuid[]) AS v(o, e, t)
WHERE c.order_id = v.o AND c.event_id = v.e AND c.claim_token = v.t AND c.others_sent_at IS NULL AND c.status = 'pending'
RETURNING c.event_id`
	blockSQL = `UPDATE charge c SET status = 'blocked', last_error = $3 FROM unnest($1::bigint[], $2::uuid[]) AS v(o, e)
WHERE c.order_id = v.o AND c.event_id = v.e AND c.status = 'pending'`
)

// markSentSQL records the sends of the pending claims of the pairs given
// ($3: each one's sender) and returns those it recorded: only those may be
// sent. A sender other than the creator also sets others_sent_at, after
// which the creator can no longer release the claim (releaseSQL).
const markSentSQL = `WITH sent AS (
UPDATE charge c SET others_sent_at = CASE WHEN v.who = 'creator' THEN c.others_sent_at ELSE coalesce(c.others_sent_at, now()) END,
in_flight_until = greatest(c.in_flight_until, now() + $4 * interval '1 millisecond'),
decide_after = greatest(c.decide_after, now() + $5 * interval '1 millisecond')
FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS v(o, e, who)
WHERE c.order_id = v.o AND c.event_id = v.e AND c.status = 'pending' RETURNING c.order_id, c.event_id, v.who),
logged AS (INSERT INTO claim_send (order_id, event_id, sender, host, in_flight_until)
SELECT order_id, event_id, who, $6, now() + $4 * interval '1 millisecond' FROM sent)
SELECT event_id FROM sent`

// ClaimOrders runs claimSQL, or claimFreshSQL when no record is a replay.
func (s *Store) ClaimOrders(ctx context.Context, group string, sends billing.SendConfig, claims []billing.NewClaim) ([]billing.ClaimAnswer, error) {
	// Event ids and tokens as [16]byte: pgx encodes those in binary as they
	// are (a uuid.UUID would go through its text form).
	orders, ids := make([]int64, len(claims)), make([][16]byte, len(claims))
	customers, amounts, tokens := make([]int64, len(claims)), make([]string, len(claims)), make([][16]byte, len(claims))
	replays := make([]int32, len(claims))
	for k, c := range claims {
		orders[k], ids[k], customers[k], amounts[k], tokens[k] = c.OrderID, c.EventID, c.CustomerID, c.Amount.String(), c.Attempt
		replays[k] = int32(c.ReplayCount)
	}
	inFlight, decideAfter := sendArgs(sends)
	sql := claimFreshSQL
	if slices.ContainsFunc(replays, func(r int32) bool { return r > 0 }) {
		sql = claimSQL
	}
	rows, err := s.db.Query(ctx, sql, orders, ids, customers, amounts, tokens, group, inFlight, decideAfter, sends.Host, replays)
	var answers []billing.ClaimAnswer
	if err == nil {
		answers, err = scanClaimAnswers(rows, len(claims))
	}
	if err != nil {
		// The statement's outcome is unknown when the rows failed: it may
		// have committed. Each event finds out on its retry, which sees its
		// own pending claim.
		return nil, classifyDB(fmt.Errorf("claim %d orders: %w", len(claims), err))
	}
	return answers, nil
}

// scanClaimAnswers scans the claim statement's rows (n at most): a NULL
// reason is a claim won. The scan targets are shared by the rows, so that
// a won claim costs no allocation beyond its answer.
func scanClaimAnswers(rows pgx.Rows, n int) ([]billing.ClaimAnswer, error) {
	defer rows.Close()
	answers := make([]billing.ClaimAnswer, 0, n)
	var id [16]byte
	var reason, cause pgtype.Text
	for rows.Next() {
		if err := rows.Scan(&id, &reason, &cause); err != nil {
			return nil, err
		}
		answers = append(answers, billing.ClaimAnswer{EventID: id, Decided: reason.Valid, Reason: reason.String, Cause: cause.String})
	}
	return answers, rows.Err()
}

// LookupClaims runs lookupSQL.
func (s *Store) LookupClaims(ctx context.Context, orders []int64, ids []uuid.UUID) ([]billing.Claim, error) {
	claims, err := queryClaims(ctx, s.db, lookupSQL, orders, dedup.Binary(ids))
	if err != nil {
		return nil, classifyDB(fmt.Errorf("read the ledger: %w", err))
	}
	return claims, nil
}

// queryClaims runs sql on db and scans its rows as claimColumns.
func queryClaims(ctx context.Context, db querier, sql string, args ...any) ([]billing.Claim, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanClaim)
}

// scanClaim scans claimColumns.
func scanClaim(row pgx.CollectableRow) (billing.Claim, error) {
	var c billing.Claim
	var amount, status string
	var token pgtype.UUID // NULL for claims made before claim_token existed
	var age int64
	var parked bool
	if err := row.Scan(&c.OrderID, (*[16]byte)(&c.EventID), &c.CustomerID, &amount, &status, &c.ClaimedAt, &token, &age, &parked); err != nil {
		return billing.Claim{}, err
	}
	c.Age = time.Duration(age) * time.Microsecond
	c.Status = billing.ClaimStateOf(status, parked)
	if token.Valid {
		c.Attempt = token.Bytes
	}
	a, err := money.ParseAmount(amount)
	if err != nil {
		return billing.Claim{}, fmt.Errorf("ledger amount of order %d: %w", c.OrderID, err)
	}
	c.Amount = a
	return c, nil
}

// ReleaseClaims runs releaseSQL.
func (s *Store) ReleaseClaims(ctx context.Context, orders []int64, ids, tokens []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := s.db.Query(ctx, releaseSQL, orders, dedup.Binary(ids), dedup.Binary(tokens))
	var released []uuid.UUID
	if err == nil {
		released, err = dedup.CollectUUIDs(rows)
	}
	return released, classifyDB(err)
}

// BlockClaims runs blockSQL.
func (s *Store) BlockClaims(ctx context.Context, orders []int64, ids []uuid.UUID, why string) (int64, error) {
	tag, err := s.db.Exec(ctx, blockSQL, orders, dedup.Binary(ids), why)
	return tag.RowsAffected(), classifyDB(err)
}

// RecordSends runs markSentSQL.
func (s *Store) RecordSends(ctx context.Context, sends billing.SendConfig, orders []int64, ids []uuid.UUID, senders []string) ([]uuid.UUID, error) {
	return recordSends(ctx, s.db, sends, orders, ids, senders)
}

// querier is what recordSends needs: a pool, a transaction or a
// connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// recordSends runs markSentSQL on db; the store and a completer's
// session share it.
func recordSends(ctx context.Context, db querier, sends billing.SendConfig, orders []int64, ids []uuid.UUID, senders []string) ([]uuid.UUID, error) {
	inFlight, decideAfter := sendArgs(sends)
	rows, err := db.Query(ctx, markSentSQL, orders, dedup.Binary(ids), senders, inFlight, decideAfter, sends.Host)
	var marked []uuid.UUID
	if err == nil {
		marked, err = dedup.CollectUUIDs(rows)
	}
	if err != nil {
		return nil, classifyDB(fmt.Errorf("record the send of %d claims: %w", len(orders), err))
	}
	return marked, nil
}

// sendArgs are the in-flight deadline D and D plus the provider's bound,
// in milliseconds, as the send statements take them.
func sendArgs(c billing.SendConfig) (inFlight, decideAfter int64) {
	return c.Deadline.Milliseconds(), (c.Deadline + c.ProviderMaxProcessing).Milliseconds()
}

// Begin begins a transaction on the store's DB.
func (s *Store) Begin(ctx context.Context) (billing.Tx, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, classifyDB(err)
	}
	return pgTx{tx: tx}, nil
}

// The ports the Store and its sessions implement.
var (
	_ billing.Store         = (*Store)(nil)
	_ billing.OperatorStore = (*Store)(nil)
	_ billing.Sessions      = (*Sessions)(nil)
	_ billing.Tx            = pgTx{}
	_ billing.Session       = pgSession{}
	_ billing.OperatorTx    = operatorTx{}
)
