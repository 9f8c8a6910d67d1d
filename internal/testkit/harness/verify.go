package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// Check names what Verify looks at.
type Check struct {
	Brokers  []string
	Topic    string
	DLQTopic string
	Group    string
	DB       *pgxpool.Pool
	Sim      *paysim.Sim
	Plan     Plan
	// FirstOrderID and LastOrderID bound the orders of this run in the
	// ledger (the database may hold other runs).
	FirstOrderID, LastOrderID int64
	// ForbidExhausted makes every "exhausted" dead-letter record of a valid
	// event a problem (SPEC §9: ordinary provider trouble and lost database
	// connections must not exhaust an event). Tests that exhaust events on
	// purpose leave it off.
	ForbidExhausted bool
	// Planted, when set, tells the dead-letter records the test wrote itself
	// (not the consumer): they are left out of Report.DLQ and of the
	// exhausted check.
	Planted func(DLQRecord) bool
}

// Report is the outcome of Verify: SPEC §9 seen from outside.
type Report struct {
	ExpectedCharges int
	ProviderCharges int // distinct charges the provider took for this run's orders
	LedgerRows      int
	Pending         int // ledger claims left 'pending'
	Blocked         int // ledger claims in any other state than 'charged' or 'pending'
	// BlockedDeclined are the declined orders whose claim ended blocked:
	// the provider refused a request of an attempt that had not created
	// the claim (its creator crashed, or the claim was parked), so SPEC §6
	// leaves the release to an operator. The provider took nothing for
	// them; they are counted, not failures, and are not ledger rows of the
	// comparison with the provider.
	BlockedDeclined []int64
	// HeldDeclined are those of BlockedDeclined whose event waits in a
	// deferred row behind the blocked claim (SPEC §11 I3: held durably;
	// after the operator's `claim release` it is refused again and
	// dead-lettered "permanent"). Each without a "permanent" record stands
	// for the one the plan expects (blockedDeclinedFates).
	HeldDeclined  []int64
	DoubleCharged []int64 // orders the provider charged more than once
	NotCharged    []int64 // valid orders without exactly one provider charge and one ledger row
	WrongCharges  []int64 // orders charged that must not be, or with the wrong amount
	// Mismatched orders have a ledger row that does not name the charge
	// the provider took: another event_id than its Idempotency-Key, or
	// another charge id.
	Mismatched []int64
	DLQ        map[dlq.Reason]int
	// Exhausted are the consumer's "exhausted" records of valid events.
	Exhausted      []DLQRecord
	InvalidMissing int // invalid records not found in the DLQ
	LaggingParts   []int
	Problems       []string
}

// VerifyAt is Verify with c.DB a pool of its own on the database at
// dbURL, closed on return: for a caller that holds no pgx pool (the demo,
// whose package imports no database driver).
func VerifyAt(ctx context.Context, dbURL string, c Check) (Report, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return Report{}, err
	}
	defer pool.Close()
	c.DB = pool
	return Verify(ctx, c)
}

// OK reports whether every guarantee held.
func (r Report) OK() bool { return len(r.Problems) == 0 }

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Verify checks that every valid order was charged exactly once at the
// provider with one matching ledger row, settled ('charged') and naming
// that charge, that nothing else was charged, that every invalid record and
// every expected DLQ reason is in the dead-letter topic, and that the
// group's committed offsets reached the end of every partition.
func Verify(ctx context.Context, c Check) (Report, error) {
	r := Report{ExpectedCharges: len(c.Plan.Charged), DLQ: map[dlq.Reason]int{}}
	if err := r.checkCharges(ctx, c); err != nil {
		return r, err
	}
	if err := r.checkDLQ(ctx, c); err != nil {
		return r, err
	}
	lags, err := Lag(ctx, c.Brokers, c.Topic, c.Group)
	if err != nil {
		return r, err
	}
	for _, l := range lags {
		if l.Committed != l.End {
			r.LaggingParts = append(r.LaggingParts, l.Partition)
		}
	}
	if len(r.LaggingParts) > 0 {
		r.problem("committed offsets short of the end on partitions %v", r.LaggingParts)
	}
	return r, nil
}

// ledgerRow is one row of the charge ledger.
type ledgerRow struct {
	eventID, amount, status, chargeID string
}

func readLedger(ctx context.Context, c Check) (map[int64]ledgerRow, error) {
	rows, err := c.DB.Query(ctx, `SELECT order_id, event_id::text, amount::text, status, coalesce(provider_charge_id, '')
FROM charge WHERE order_id BETWEEN $1 AND $2`, c.FirstOrderID, c.LastOrderID)
	if err != nil {
		return nil, fmt.Errorf("read ledger: %w", err)
	}
	defer rows.Close()
	ledger := map[int64]ledgerRow{}
	for rows.Next() {
		var id int64
		var row ledgerRow
		if err := rows.Scan(&id, &row.eventID, &row.amount, &row.status, &row.chargeID); err != nil {
			return nil, fmt.Errorf("read ledger: %w", err)
		}
		ledger[id] = row
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read ledger: %w", err)
	}
	return ledger, nil
}

// checkCharges compares the provider's charges, the ledger and the plan.
func (r *Report) checkCharges(ctx context.Context, c Check) error {
	provider := map[int64][]paysim.ChargeRecord{}
	for _, ch := range c.Sim.Charges() {
		if ch.OrderID >= c.FirstOrderID && ch.OrderID <= c.LastOrderID {
			provider[ch.OrderID] = append(provider[ch.OrderID], ch)
			r.ProviderCharges++
		}
	}
	ledger, err := readLedger(ctx, c)
	if err != nil {
		return err
	}
	r.LedgerRows = len(ledger)
	var pending, blocked []int64
	for order, row := range ledger {
		switch row.status {
		case "charged":
		case "pending":
			pending = append(pending, order)
		case "blocked":
			if c.Plan.Declined[order] && len(provider[order]) == 0 {
				r.BlockedDeclined = append(r.BlockedDeclined, order)
				continue
			}
			fallthrough
		default:
			blocked = append(blocked, order)
		}
		if _, ok := c.Plan.Charged[order]; !ok {
			r.WrongCharges = append(r.WrongCharges, order)
		}
	}
	r.LedgerRows -= len(r.BlockedDeclined)
	if r.HeldDeclined, err = deferredOrders(ctx, c, r.BlockedDeclined); err != nil {
		return err
	}
	r.Pending, r.Blocked = len(pending), len(blocked)
	for order, chs := range provider {
		if len(chs) > 1 {
			r.DoubleCharged = append(r.DoubleCharged, order)
		}
		if _, ok := c.Plan.Charged[order]; !ok {
			r.WrongCharges = append(r.WrongCharges, order)
		}
	}
	for order, amount := range c.Plan.Charged {
		chs, row := provider[order], ledger[order]
		switch {
		case len(chs) == 0 || len(chs) == 1 && row.amount == "":
			r.NotCharged = append(r.NotCharged, order)
		case len(chs) > 1: // counted as a double charge
		case row.amount != amount.String() || chs[0].Amount != amount.String():
			r.WrongCharges = append(r.WrongCharges, order)
		case row.status == "charged" && (row.eventID != chs[0].Key || row.chargeID != chs[0].ChargeID):
			r.Mismatched = append(r.Mismatched, order)
		}
	}
	for _, ids := range [][]int64{pending, blocked, r.DoubleCharged, r.NotCharged, r.WrongCharges, r.Mismatched} {
		slices.Sort(ids)
	}
	r.WrongCharges = slices.Compact(r.WrongCharges)
	r.chargeProblems(pending, blocked)
	return nil
}

// chargeProblems reports what checkCharges found wrong: claims left
// pending or blocked, and the orders of each list of r it filled.
func (r *Report) chargeProblems(pending, blocked []int64) {
	if len(pending) > 0 {
		r.problem("%d ledger claims left pending (a charge of unknown outcome): %v", len(pending), head(pending))
	}
	if len(blocked) > 0 {
		r.problem("%d ledger claims neither charged nor pending (blocked): %v", len(blocked), head(blocked))
	}
	if len(r.DoubleCharged) > 0 {
		r.problem("%d orders charged more than once at the provider: %v", len(r.DoubleCharged), head(r.DoubleCharged))
	}
	if len(r.NotCharged) > 0 {
		r.problem("%d valid orders not charged exactly once with a ledger row: %v", len(r.NotCharged), head(r.NotCharged))
	}
	if len(r.WrongCharges) > 0 {
		r.problem("%d orders charged that must not be, or with a wrong amount: %v", len(r.WrongCharges), head(r.WrongCharges))
	}
	if len(r.Mismatched) > 0 {
		r.problem("%d ledger rows name another event or charge id than the provider's charge: %v", len(r.Mismatched), head(r.Mismatched))
	}
	if r.ProviderCharges != r.LedgerRows {
		r.problem("the provider took %d distinct charges, the ledger has %d rows", r.ProviderCharges, r.LedgerRows)
	}
}

// checkDLQ reads the dead-letter topic: its headers, the invalid records,
// the expected reasons and (with ForbidExhausted) no exhausted valid event.
func (r *Report) checkDLQ(ctx context.Context, c Check) error {
	records, err := ReadAll(ctx, c.Brokers, c.DLQTopic)
	if err != nil {
		return err
	}
	records = consumerRecords(records, c.Planted)
	seen := map[string]bool{}
	for _, rec := range records {
		r.DLQ[rec.Reason]++
		seen[rec.Value] = true
		if rec.Reason == dlq.Exhausted && !c.Plan.InvalidValues[rec.Value] {
			r.Exhausted = append(r.Exhausted, rec)
		}
		for _, h := range []string{dlq.HeaderOriginalTopic, dlq.HeaderOriginalPartition, dlq.HeaderOriginalOffset,
			dlq.HeaderConsumerGroup, dlq.HeaderReason, dlq.HeaderError, dlq.HeaderAttempts, dlq.HeaderFailedAt} {
			if rec.Headers[h] == "" {
				r.problem("a DLQ record lacks header %s", h)
				break
			}
		}
	}
	for v := range c.Plan.InvalidValues {
		if !seen[v] {
			r.InvalidMissing++
		}
	}
	if r.InvalidMissing > 0 {
		r.problem("%d invalid records are not in the DLQ", r.InvalidMissing)
	}
	stand := r.blockedDeclinedFates(records)
	for reason, n := range c.Plan.DLQ {
		got := r.DLQ[reason]
		if reason == dlq.Permanent {
			got += stand
		}
		if got < n {
			r.problem("DLQ has %d %q records, want at least %d", r.DLQ[reason], reason, n)
		}
	}
	if c.ForbidExhausted {
		for _, rec := range r.Exhausted {
			r.problem("valid event dead-lettered as exhausted after %s attempts: %s (record %s)",
				rec.Headers[dlq.HeaderAttempts], rec.Headers[dlq.HeaderError], rec.Value)
		}
	}
	return nil
}

// consumerRecords returns the records planted does not claim as the
// test's own (all of them when planted is nil), in place.
func consumerRecords(records []DLQRecord, planted func(DLQRecord) bool) []DLQRecord {
	if planted == nil {
		return records
	}
	return slices.DeleteFunc(records, planted)
}

// blockedDeclinedFates checks that each declined order whose claim ended
// blocked kept its event, and returns how many of them stand for the
// "permanent" record the plan expects without having one. Such an order
// (the completer was refused before the event's redelivery came, or the
// claim was parked) has either its "permanent" record already (its event
// was refused and dead-lettered before the completer blocked the claim)
// or its event waiting in a deferred row for the operator (HeldDeclined,
// SPEC §11 I3: after `claim release` it is refused again and
// dead-lettered). An order with neither has lost its event, or was
// dead-lettered for another reason than the true one (I2: an event
// behind a blocked claim is never a "conflict", in this build or the
// previous release).
func (r *Report) blockedDeclinedFates(records []DLQRecord) (stand int) {
	if len(r.BlockedDeclined) == 0 {
		return 0
	}
	permanent := map[int64]bool{}
	for _, rec := range records {
		var ev eventJSON
		if rec.Reason == dlq.Permanent && json.Unmarshal([]byte(rec.Value), &ev) == nil {
			permanent[ev.OrderID] = true
		}
	}
	var lost []int64
	for _, order := range r.BlockedDeclined {
		switch {
		case permanent[order]:
		case slices.Contains(r.HeldDeclined, order):
			stand++
		default:
			lost = append(lost, order)
		}
	}
	if len(lost) > 0 {
		r.problem("%d declined orders blocked with their event neither dead-lettered \"permanent\" nor deferred: %v", len(lost), head(lost))
	}
	return stand
}

// deferredOrders returns those of orders that have an event in a deferred
// row of c's group.
func deferredOrders(ctx context.Context, c Check, orders []int64) ([]int64, error) {
	if len(orders) == 0 {
		return nil, nil
	}
	rows, err := c.DB.Query(ctx, `SELECT DISTINCT order_id FROM deferred_event
WHERE consumer_group = $1 AND order_id = ANY($2) ORDER BY order_id`, c.Group, orders)
	if err != nil {
		return nil, fmt.Errorf("read deferred events: %w", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read deferred events: %w", err)
	}
	return held, nil
}

func head(ids []int64) []int64 {
	if len(ids) > 10 {
		return ids[:10]
	}
	return ids
}
