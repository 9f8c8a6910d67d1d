package harness

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/paysim"
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
}

// Report is the outcome of Verify: SPEC §9 seen from outside.
type Report struct {
	ExpectedCharges int
	ProviderCharges int // distinct charges the provider took for this run's orders
	LedgerRows      int
	DoubleCharged   []int64 // orders the provider charged more than once
	NotCharged      []int64 // valid orders without exactly one provider charge and one ledger row
	WrongCharges    []int64 // orders charged that must not be, or with the wrong amount
	DLQ             map[dlq.Reason]int
	InvalidMissing  int // invalid records not found in the DLQ
	LaggingParts    []int
	Problems        []string
}

// OK reports whether every guarantee held.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Verify checks that every valid order was charged exactly once at the
// provider with one matching ledger row, that nothing else was charged,
// that every invalid record and every expected DLQ reason is in the
// dead-letter topic, and that the group's committed offsets reached the end
// of every partition.
func Verify(ctx context.Context, c Check) (Report, error) {
	r := Report{ExpectedCharges: len(c.Plan.Charged), DLQ: map[dlq.Reason]int{}}
	problem := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }

	provider := map[int64]int{}
	providerAmount := map[int64]string{}
	for _, ch := range c.Sim.Charges() {
		if ch.OrderID < c.FirstOrderID || ch.OrderID > c.LastOrderID {
			continue
		}
		provider[ch.OrderID]++
		providerAmount[ch.OrderID] = ch.Amount
		r.ProviderCharges++
	}
	rows, err := c.DB.Query(ctx, "SELECT order_id, amount::text, status FROM charge WHERE order_id BETWEEN $1 AND $2", c.FirstOrderID, c.LastOrderID)
	if err != nil {
		return r, fmt.Errorf("read ledger: %w", err)
	}
	ledger := map[int64]string{}
	var pending []int64
	for rows.Next() {
		var id int64
		var amount, status string
		if err := rows.Scan(&id, &amount, &status); err != nil {
			return r, err
		}
		ledger[id] = amount
		if status != "charged" {
			pending = append(pending, id)
		}
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("read ledger: %w", err)
	}
	r.LedgerRows = len(ledger)

	for order, n := range provider {
		if n > 1 {
			r.DoubleCharged = append(r.DoubleCharged, order)
		}
		if _, ok := c.Plan.Charged[order]; !ok {
			r.WrongCharges = append(r.WrongCharges, order)
		}
	}
	for order, amount := range c.Plan.Charged {
		if provider[order] != 1 {
			if provider[order] == 0 {
				r.NotCharged = append(r.NotCharged, order)
			}
			continue
		}
		want := amount.String()
		if ledger[order] == "" {
			r.NotCharged = append(r.NotCharged, order)
		} else if ledger[order] != want || providerAmount[order] != want {
			r.WrongCharges = append(r.WrongCharges, order)
		}
	}
	for order := range ledger {
		if _, ok := c.Plan.Charged[order]; !ok {
			r.WrongCharges = append(r.WrongCharges, order)
		}
	}
	slices.Sort(r.DoubleCharged)
	slices.Sort(r.NotCharged)
	slices.Sort(r.WrongCharges)
	if len(pending) > 0 {
		slices.Sort(pending)
		problem("%d orders left with a charge of unknown outcome (ledger status pending): %v", len(pending), head(pending))
	}
	if len(r.DoubleCharged) > 0 {
		problem("%d orders charged more than once at the provider: %v", len(r.DoubleCharged), head(r.DoubleCharged))
	}
	if len(r.NotCharged) > 0 {
		problem("%d valid orders not charged exactly once with a ledger row: %v", len(r.NotCharged), head(r.NotCharged))
	}
	if len(r.WrongCharges) > 0 {
		problem("%d orders charged that must not be, or with a wrong amount: %v", len(r.WrongCharges), head(r.WrongCharges))
	}

	records, err := ReadAll(ctx, c.Brokers, c.DLQTopic)
	if err != nil {
		return r, err
	}
	seen := map[string]bool{}
	for _, rec := range records {
		r.DLQ[rec.Reason]++
		seen[rec.Value] = true
		for _, h := range []string{dlq.HeaderOriginalTopic, dlq.HeaderOriginalPartition, dlq.HeaderOriginalOffset,
			dlq.HeaderConsumerGroup, dlq.HeaderReason, dlq.HeaderError, dlq.HeaderAttempts, dlq.HeaderFailedAt} {
			if rec.Headers[h] == "" {
				problem("a DLQ record lacks header %s", h)
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
		problem("%d invalid records are not in the DLQ", r.InvalidMissing)
	}
	for reason, n := range c.Plan.DLQ {
		if r.DLQ[reason] < n {
			problem("DLQ has %d %q records, want at least %d", r.DLQ[reason], reason, n)
		}
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
		problem("committed offsets short of the end on partitions %v", r.LaggingParts)
	}
	return r, nil
}

func head(ids []int64) []int64 {
	if len(ids) > 10 {
		return ids[:10]
	}
	return ids
}
