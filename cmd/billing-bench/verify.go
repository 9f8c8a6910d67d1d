package main

import (
	"context"
	"fmt"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// verify checks, after a clean stop, that the orders of exactly the
// committed records were charged, each once, at the provider and in the
// ledger. drain says the topic should have been consumed to its end.
func (b *bench) verify(ctx context.Context, p *phase, r *result, drain bool) error {
	fail := func(format string, args ...any) {
		r.problems = append(r.problems, fmt.Sprintf("%s: ", p.topic)+fmt.Sprintf(format, args...))
	}
	lags, err := harness.Lag(ctx, b.o.brokers, p.topic, p.group)
	if err != nil {
		return err
	}
	committed := map[int]int64{}
	for _, l := range lags {
		committed[l.Partition] = max(l.Committed, 0)
		if drain && l.Committed != l.End {
			r.notes = append(r.notes, fmt.Sprintf("%s: partition %d committed %d of %d", p.topic, l.Partition, l.Committed, l.End))
		}
	}
	recs, err := readBack(ctx, b.o.brokers, p.topic)
	if err != nil {
		return err
	}
	orders := map[int64]bool{}
	for _, rec := range recs {
		if rec.offset < committed[rec.partition] {
			orders[rec.orderID] = true
		}
	}
	if d := p.sim.DoubleCharged(); len(d) > 0 {
		fail("%d orders charged twice, e.g. %v", len(d), d[:min(len(d), 5)])
	}
	if n := p.sim.ChargesTaken(); n != len(orders) {
		fail("the provider took %d charges for %d committed orders", n, len(orders))
	}
	notOnce := 0
	for o := range orders {
		if p.sim.ChargesFor(o) != 1 {
			notOnce++
		}
	}
	if notOnce > 0 {
		fail("%d committed orders not charged exactly once", notOnce)
	}
	var ledger int
	if err := p.db.QueryRow(ctx, "SELECT count(*) FROM charge WHERE order_id >= $1 AND order_id < $2 AND provider_charge_id IS NOT NULL",
		p.firstOrder, p.firstOrder+p.orders).Scan(&ledger); err != nil {
		return fmt.Errorf("count ledger rows: %w", err)
	}
	if ledger != p.sim.ChargesTaken() {
		fail("%d ledger rows for %d provider charges", ledger, p.sim.ChargesTaken())
	}
	var pending int
	if err := p.db.QueryRow(ctx, "SELECT count(*) FROM charge WHERE order_id >= $1 AND order_id < $2 AND status <> 'charged'",
		p.firstOrder, p.firstOrder+p.orders).Scan(&pending); err != nil {
		return fmt.Errorf("count unsettled ledger claims: %w", err)
	}
	if pending > 0 {
		fail("%d ledger claims left pending or blocked", pending)
	}
	r.Charges += len(orders) - notOnce
	return nil
}
