package metrics

import "github.com/prometheus/client_golang/prometheus"

// NewPositionWritesFailed creates billing_position_writes_failed_total
// and registers it on reg: one count per failed write of the consumer's
// positions (consumer.Config.OnPositionsFailed), each of which stopped
// the offset commit it preceded. It starts at 0. A rate above zero that
// lasts means offsets are not being committed: the lag grows and a
// restart would redeliver (safely) everything since the last commit.
func NewPositionWritesFailed(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: PositionWritesFailed,
		Help: "Failed writes of the consumer's positions to the database; each stopped the Kafka offset commit it preceded.",
	})
	reg.MustRegister(c)
	return c
}

// Heal is the failover heal's metrics (internal/heal).
type Heal struct {
	// Rewound is billing_failover_rewound_records_total: records below
	// the group's committed offsets that a heal re-decides, because the
	// database lost their decisions. Counted by the replica that installs
	// the heal.
	Rewound prometheus.Counter
	// Blocked is billing_failover_blocked_orders_total: orders a heal
	// blocked for an operator (two or more events in the lost records,
	// no surviving claim).
	Blocked prometheus.Counter
	// Healing is billing_failover_healing: 1 while this replica holds
	// billing for a heal.
	Healing prometheus.Gauge
}

// NewHeal creates the heal's metrics at 0 and registers them on reg.
func NewHeal(reg prometheus.Registerer) Heal {
	h := Heal{
		Rewound: prometheus.NewCounter(prometheus.CounterOpts{Name: FailoverRewound,
			Help: "Records below the committed offsets that a failover heal re-decides because the database lost their decisions."}),
		Blocked: prometheus.NewCounter(prometheus.CounterOpts{Name: FailoverBlocked,
			Help: "Orders a failover heal blocked for an operator: events the lost records cannot tell apart (docs/operations.md, After a failover)."}),
		Healing: prometheus.NewGauge(prometheus.GaugeOpts{Name: FailoverHealing,
			Help: "1 while this replica holds billing for a failover heal (the lost records are re-decided first)."}),
	}
	reg.MustRegister(h.Rewound, h.Blocked, h.Healing)
	return h
}
