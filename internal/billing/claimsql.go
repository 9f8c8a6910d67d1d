package billing

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
// the record's ($10) and whose reason is a decision (not replayedReason),
// unless the event's own claim is charged, returns the event with its
// stored reason and error, and the event is not claimed. The healthy path
// pays no statement for it: the claim's returned rows carry it (a NULL
// reason is a claim won). A replayed record (rp) leaves the row at its
// count with replayedReason instead of a decision older than it, in the
// same statement as its claim: from then on no record of the event is
// answered by the spent dead letter, and the event's next dead letter,
// from any of its records, is stored at that count (recordDeadLetterSQL).
// rp takes its rows in event order, so that two claim statements lock
// dead_letter rows in one order (Postgres does not order ins and rp
// against each other: a deadlock across the two tables, which needs two
// batches replaying the same events at once, is a Transient error,
// retried; classify.go).
var claimSQL = `WITH v AS (
  SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::text[], $5::uuid[], $10::int[]) WITH ORDINALITY AS v(o, e, c, a, t, r, n)),
dl AS (
  SELECT d.event_id, d.reason, d.error FROM v JOIN dead_letter d ON d.event_id = v.e AND d.consumer_group = $6
    AND d.order_id = v.o AND d.customer_id = v.c AND d.amount = v.a::numeric AND d.replay_count >= v.r
  WHERE d.reason <> '` + replayedReason + `' AND NOT EXISTS (SELECT 1 FROM charge x WHERE x.event_id = v.e AND x.status = 'charged')),
rp AS (
  INSERT INTO dead_letter AS d (event_id, consumer_group, order_id, customer_id, amount, reason, replay_count, error)
  SELECT e, $6, o, c, a::numeric, '` + replayedReason + `', r, '' FROM v WHERE r > 0 ORDER BY e
  ON CONFLICT (event_id, consumer_group, order_id, customer_id, amount) DO UPDATE
  SET reason = excluded.reason, replay_count = excluded.replay_count, error = '', decided_at = now()
  WHERE d.replay_count < excluded.replay_count),
ins AS (
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
