package main

import (
	"context"
	"fmt"
	"time"
)

// counters are the consumer's cumulative resource counters at one moment,
// with the group's committed records as last polled just before them.
type counters struct {
	at         time.Time
	committed  int64   // records committed, from the poller's latest sample
	cpu        float64 // user+system CPU seconds of the consumer process (/proc/<pid>/stat)
	mallocs    float64 // go_memstats_mallocs_total of the consumer
	allocBytes float64 // go_memstats_alloc_bytes_total of the consumer
}

// readCounters reads the consumer's CPU time first (the cheap, precise
// reading) and then its Go allocation counters from /metrics; committed
// is the committed total the caller polled just before.
func readCounters(ctx context.Context, p *consumerProc, committed int64) (counters, error) {
	c := counters{at: time.Now(), committed: committed}
	_, cpu, ok := procCPU(p.Pid())
	if !ok {
		return c, fmt.Errorf("read /proc/%d/stat of the consumer", p.Pid())
	}
	c.cpu = cpu
	s, err := scrape(ctx, p.httpAddr)
	if err != nil {
		return c, err
	}
	c.mallocs, c.allocBytes = s.Mallocs, s.AllocBytes
	return c, nil
}

// cost is what the consumer spent on the events committed between two
// readings of its counters.
type cost struct {
	Events     int64         // committed between the readings
	Window     time.Duration // between the readings
	CPU        float64       // consumer CPU seconds, user+system
	Mallocs    float64       // heap objects allocated
	AllocBytes float64       // bytes allocated
}

// costBetween returns the consumer's cost from reading a to reading b.
func costBetween(a, b counters) cost {
	return cost{
		Events: b.committed - a.committed, Window: b.at.Sub(a.at),
		CPU: b.cpu - a.cpu, Mallocs: b.mallocs - a.mallocs, AllocBytes: b.allocBytes - a.allocBytes,
	}
}

// per divides v by the events of c; 0 without events.
func (c cost) per(v float64) float64 {
	if c.Events <= 0 {
		return 0
	}
	return v / float64(c.Events)
}

// CPUPerEvent is the consumer's CPU time per committed event, in µs.
func (c cost) CPUPerEvent() float64 { return c.per(c.CPU * 1e6) }

// AllocsPerEvent is the number of heap allocations per committed event.
func (c cost) AllocsPerEvent() float64 { return c.per(c.Mallocs) }

// BytesPerEvent is the number of bytes allocated per committed event.
func (c cost) BytesPerEvent() float64 { return c.per(c.AllocBytes) }
