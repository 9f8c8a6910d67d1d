package main

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// steadyPhase starts a consumer on an empty topic, offers it
// r.SteadyRecords records at r.SteadyRate once it has joined its group,
// and measures the produce-to-commit latency of each.
func (b *bench) steadyPhase(ctx context.Context, m mode, latency time.Duration, r *result) error {
	s, err := b.startSteady(ctx, m, latency, b.bin(r), r)
	if err != nil {
		return err
	}
	defer s.close()
	samples, back, err := b.endSteady(ctx, s, r, "its end")
	if err != nil {
		return err
	}
	lat, missing := commitLatencies(samples, back)
	r.P50, r.P99, r.LatencyMissing = percentile(lat, 0.5), percentile(lat, 0.99), missing
	return b.verify(ctx, s.p, r, true)
}

// steadyRun is a steady load being offered: its phase, its records, the
// consumer and the poller of its committed offsets.
type steadyRun struct {
	p    *phase
	recs []kafka.Message
	proc *consumerProc
	poll *poller
	end  func() // ends the phase (bench.endPhase)
}

// startSteady starts bin as the consumer of a fresh phase of m at latency,
// waits until it has joined its group, and offers it r.SteadyRecords
// records at r.SteadyRate while polling its committed offsets. The caller
// closes the run once it has read what it needs.
func (b *bench) startSteady(ctx context.Context, m mode, latency time.Duration, bin string, r *result) (*steadyRun, error) {
	p, err := b.newPhase(ctx, m, latency, "steady", r.SteadyRecords, r.Baseline)
	if err != nil {
		return nil, err
	}
	s := &steadyRun{p: p, end: func() { b.endPhase(p) }}
	if s.recs, err = workload(p.firstOrder, r.SteadyRecords); err != nil {
		s.close()
		return nil, err
	}
	if s.proc, err = startConsumer(bin, p.env, b.log); err != nil {
		s.close()
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = s.proc.waitReady(rctx)
	cancel()
	if err != nil {
		s.close()
		return nil, err
	}
	s.poll = startPoller(ctx, b.o.brokers, p.topic, p.group, partitions, b.o.poll)
	if err := produceSteady(ctx, b.o.brokers, p.topic, s.recs, r.SteadyRate); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// close stops what startSteady started, in reverse order.
func (s *steadyRun) close() {
	if s.poll != nil {
		s.poll.finish()
	}
	if s.proc != nil {
		s.proc.Stop(5 * time.Second)
	}
	s.end()
}

// endSteady waits, up to a minute, until the records of the steady load s
// are committed (a note in r says when they were not; when names the
// moment the minute starts from), then stops the poller and the consumer,
// records its peak RSS in r and reads the topic back.
func (b *bench) endSteady(ctx context.Context, s *steadyRun, r *result, when string) ([]sample, []record, error) {
	proc, poll, n := s.proc, s.poll, len(s.recs)
	deadline := time.Now().Add(time.Minute)
	for poll.last().total() < int64(n) {
		if err := proc.exited(); err != nil {
			return nil, nil, err
		}
		if time.Now().After(deadline) {
			r.notes = append(r.notes, fmt.Sprintf("steady load not committed within a minute of %s (%d of %d)", when, poll.last().total(), n))
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	samples := poll.finish()
	rss, err := peakRSS(proc.Pid())
	if err != nil {
		return nil, nil, err
	}
	if err := proc.Stop(45 * time.Second); err != nil {
		return nil, nil, fmt.Errorf("billing-consumer did not stop cleanly: %w", err)
	}
	r.PeakRSS = max(r.PeakRSS, rss)
	back, err := readBack(ctx, b.o.brokers, s.p.topic)
	return samples, back, err
}
