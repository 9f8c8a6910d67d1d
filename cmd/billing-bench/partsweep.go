package main

import (
	"context"
	"fmt"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// The partition sweep: one replica drains the same backlog from a topic of
// few and of many partitions, with the pod's GOMEMLIMIT, so that what an
// owned partition costs shows (a Deployment scaled down hands one replica
// every partition of the topic).
var sweepPartitions = []int{12, 160}

const (
	// partsBacklog is each drain's backlog (times -scale): 500 records a
	// partition at 160.
	partsBacklog = 80_000
	// podGoMemLimit is the GOMEMLIMIT of deploy/base/deployment.yaml (its
	// 256Mi limit less 10%); deploy/memory_test.go checks that they agree.
	podGoMemLimit = "230MiB"
)

// batching is a way the producer batches a sweep's backlog: Kafka returns
// whole record batches, so what a partition's fetch holds depends on it.
type batching struct {
	name    string
	produce producer
}

// batchings are the producers of the sweep, each a row at every partition
// count. Large batches (1 MiB, a few ms of linger, as franz-go's defaults
// or a Java producer's batch.size=1MB) belong here beside kafka-go's small
// ones.
var batchings = []batching{
	{"small batches (kafka-go, 500 records)", harness.Produce},
}

// runPartitions drains the sweep's backlog at every partition count with
// every batching, -repeat times each; a row is their summary (the median
// drain's figures, the largest peaks).
func (b *bench) runPartitions(ctx context.Context) ([]drain, error) {
	var rows []drain
	for _, bt := range batchings {
		for _, n := range sweepPartitions {
			s := drainSpec{bin: b.under, partitions: n, backlog: max(1000, int(partsBacklog*b.o.scale)),
				env: []string{"GOMEMLIMIT=" + podGoMemLimit}, produce: bt.produce, batching: bt.name}
			var runs []drain
			for range b.o.repeat {
				d, err := b.drain(ctx, s)
				if err != nil {
					return rows, fmt.Errorf("%d partitions, %s: %w", n, bt.name, err)
				}
				runs = append(runs, d)
			}
			rows = append(rows, summarize(runs))
		}
	}
	return rows, nil
}
