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
