package main

import (
	"context"
	"fmt"
	"time"
)

// counters are the consumer's cumulative counters at one moment, with the
// group's committed records as last polled just before them.
type counters struct {
	at         time.Time
	committed  int64   // records committed, from the poller's latest sample
	finished   float64 // billing_events_total of the consumer, every result
	cpu        float64 // user+system CPU seconds of the consumer process (/proc/<pid>/stat)
	mallocs    float64 // go_memstats_mallocs_total of the consumer
	allocBytes float64 // go_memstats_alloc_bytes_total of the consumer
}

// readCounters reads the consumer's CPU time first (the cheap, precise
// reading) and then, in one /metrics scrape, the events it has finished
// and its Go allocation counters; committed is the committed total the
// caller polled just before.
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
	c.finished, c.mallocs, c.allocBytes = s.Finished, s.Mallocs, s.AllocBytes
	return c, nil
}

// cost is what the consumer spent on the events it finished between two
// readings of its counters. The events are counted by the consumer
// (billing_events_total) in the same scrape as the allocations, not from
// the committed offsets: those lag the work by up to the commit interval,
// so at the first reading up to a second of finished events would not be
// committed yet, and would be counted in the window without their cost.
// At the end of a drained backlog the two counts agree (every finished
// event is committed before the check).
type cost struct {
	Events     int64         // finished between the readings
	Committed  int64         // committed between the readings, for comparison
	Window     time.Duration // between the readings
	CPU        float64       // consumer CPU seconds, user+system
	Mallocs    float64       // heap objects allocated
	AllocBytes float64       // bytes allocated
}

// costBetween returns the consumer's cost from reading a to reading b.
func costBetween(a, b counters) cost {
	return cost{
		Events: int64(b.finished - a.finished), Committed: b.committed - a.committed, Window: b.at.Sub(a.at),
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

// Rate is the events finished per second of the window; 0 without events.
func (c cost) Rate() float64 {
	if c.Events <= 0 || c.Window <= 0 {
		return 0
	}
	return float64(c.Events) / c.Window.Seconds()
}

// CPUPerEvent is the consumer's CPU time per finished event, in µs.
func (c cost) CPUPerEvent() float64 { return c.per(c.CPU * 1e6) }

// AllocsPerEvent is the number of heap allocations per finished event.
func (c cost) AllocsPerEvent() float64 { return c.per(c.Mallocs) }

// BytesPerEvent is the number of bytes allocated per finished event.
func (c cost) BytesPerEvent() float64 { return c.per(c.AllocBytes) }
