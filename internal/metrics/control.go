package metrics

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Control holds the gauges of the operator's controls and of this
// replica's share of the topic: whether billing is paused, and which
// partitions this replica owns. Safe for concurrent use.
type Control struct {
	// Paused is 1 while an operator's pause is in force (billing_paused),
	// as this replica last read it; PausedSeconds how long it has been
	// in force by the database's clock, 0 when not paused.
	Paused, PausedSeconds prometheus.Gauge

	// owned is billing_kafka_partition_owned{topic,partition}: 1 for the
	// partitions this replica owns now, 0 for those it owned earlier in
	// its life and no longer does.
	owned *prometheus.GaugeVec
	topic string
	mu    sync.Mutex
	held  map[int]bool
}

// NewControl creates the control gauges for topic and registers them on
// reg. Paused starts at 0; the owned gauge has no series until the first
// assignment: before it the replica knows no partition it could own.
func NewControl(reg prometheus.Registerer, topic string) *Control {
	c := &Control{
		Paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: Paused, Help: "1 while an operator's pause of billing (billing-consumer pause) is in force, as this replica last read it.",
		}),
		PausedSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: PausedSeconds, Help: "How long the operator's pause has been in force, by the database's clock; 0 when not paused.",
		}),
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: KafkaPartitionOwned, Help: "1 for each partition of the topic this replica owns now; 0 for one it owned before and no longer does.",
		}, []string{"topic", "partition"}),
		topic: topic,
		held:  map[int]bool{},
	}
	reg.MustRegister(c.Paused, c.PausedSeconds, c.owned)
	return c
}

// Owned records the partitions this replica owns from now on (nil when a
// generation ends and it owns none).
func (c *Control) Owned(partitions []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := map[int]bool{}
	for _, p := range partitions {
		now[p] = true
		c.owned.WithLabelValues(c.topic, strconv.Itoa(p)).Set(1)
	}
	for p := range c.held {
		if !now[p] {
			c.owned.WithLabelValues(c.topic, strconv.Itoa(p)).Set(0)
		}
	}
	for p := range now {
		c.held[p] = true
	}
}
