package main

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// The partition sweep: one replica drains the same backlog from a topic of
// few and of many partitions, with the pod's GOMEMLIMIT, so that what an
// owned partition costs shows (a Deployment scaled down hands one replica
// every partition of the topic).
var sweepPartitions = []int{12, 160}

const (
	// podGoMemLimit is the GOMEMLIMIT of deploy/base/deployment.yaml (its
	// 256Mi limit less 10%); deploy/memory_test.go checks that they agree.
	podGoMemLimit = "230MiB"
)

// batching is a way the producer batches a sweep's backlog: Kafka returns
// whole record batches, so what a partition's fetch holds depends on it.
type batching struct {
	name    string
	produce producer
	backlog int // of each drain, times -scale
}

// batchings are the producers of the sweep, each a row at every partition
// count: kafka-go's small batches, and large ones as franz-go's defaults
// make them (see produceLarge). The large rows drain 1,500 records a
// partition at 160 (about 300 KB a batch, several fetch shares), as the
// drain measured from outside for issue 31 (1,150): with 500, as the small
// rows, each partition's batch fitted a share or two, and the sweep
// reported 145 MB peak RSS where such a drain peaked at 205 MB.
var batchings = []batching{
	{"small batches (kafka-go, 500 records)", harness.Produce, 80_000},
	{"large batches (1 MB, 10 ms linger, snappy)", produceLarge, 240_000},
}

// produceLarge writes recs as franz-go's producer does with its defaults
// (v1.22: record batches up to 1,000,012 bytes, 10 ms of linger, snappy),
// which a Java producer with batch.size=1MB, a linger and compression
// resembles: kafka-go's writer with those limits, given the whole backlog
// in one call so that each partition's batch fills up to the limit (fed a
// thousand at a time, as harness.Produce is, a batch of a 160-partition
// topic gets about six records). Partitioned as harness.Produce does.
func produceLarge(ctx context.Context, brokers []string, topic string, recs []kafka.Message) error {
	tr := &kafka.Transport{} // not the default one: see harness.Produce
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchBytes: 1_000_012, BatchSize: len(recs), BatchTimeout: 10 * time.Millisecond,
		Compression: kafka.Snappy, Transport: tr,
	}
	defer w.Close()
	if err := w.WriteMessages(ctx, recs...); err != nil {
		return fmt.Errorf("produce to %s: %w", topic, err)
	}
	return nil
}

// runPartitions drains the sweep's backlog at every partition count with
// every batching, -repeat times each; a row is their summary (the median
// drain's figures, the largest peaks). The rows take turns, a drain each,
// as the drain's pairs do: the database grows with every drain, so rows
// drained one after the other put the growth on the later ones (160
// partitions with small batches measured 1.28x the CPU per event of 12 so,
// 1.14x when the two took turns).
func (b *bench) runPartitions(ctx context.Context) ([]drain, error) {
	var specs []drainSpec
	for _, bt := range batchings {
		for _, n := range sweepPartitions {
			specs = append(specs, drainSpec{bin: b.under, partitions: n, backlog: max(1000, int(float64(bt.backlog)*b.o.scale)),
				env: []string{"GOMEMLIMIT=" + podGoMemLimit}, produce: bt.produce, batching: bt.name})
		}
	}
	runs := make([][]drain, len(specs))
	for range b.o.repeat {
		for k, s := range specs {
			d, err := b.drain(ctx, s)
			if err != nil {
				return nil, fmt.Errorf("%d partitions, %s: %w", s.partitions, s.batching, err)
			}
			runs[k] = append(runs[k], d)
		}
	}
	rows := make([]drain, len(specs))
	for k := range specs {
		rows[k] = summarize(runs[k])
		// A round's drains run back to back: each against the drain of
		// the same round with the fewest partitions and the same batching
		// is steadier than the rows' medians (1.07x to 1.33x for one
		// binary across sittings).
		var rs []float64
		for i, d := range runs[k] {
			if base := runs[k-k%len(sweepPartitions)][i].CPU; base > 0 {
				rs = append(rs, d.CPU/base)
			}
		}
		rows[k].CPURatio = median(rs)
	}
	return rows, nil
}
