package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// sample is the group's committed offsets at one moment.
type sample struct {
	at        time.Time // when the broker's answer arrived
	committed []int64   // per partition; 0 when nothing is committed yet
}

// total is the number of records committed, the topic being fresh (its
// offsets start at 0).
func (s sample) total() int64 {
	var n int64
	for _, c := range s.committed {
		n += c
	}
	return n
}

// poller records the committed offsets of a group on a fresh topic every
// interval, with one OffsetFetch request on a kept-open connection: the
// four requests of harness.Lag on a new connection each time would cost
// more than the 20 ms interval on a loaded machine.
type poller struct {
	mu      sync.Mutex
	samples []sample
	errs    int
	stop    func()
	done    chan struct{}
}

// startPoller polls until stop is called.
func startPoller(ctx context.Context, brokers []string, topic, group string, partitions int, every time.Duration) *poller {
	ctx, cancel := context.WithCancel(ctx)
	p := &poller{stop: cancel, done: make(chan struct{})}
	tr := &kafka.Transport{}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: tr}
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	go func() {
		defer close(p.done)
		defer tr.CloseIdleConnections()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
			at := time.Now()
			if err == nil && res.Error != nil && !errors.Is(res.Error, kafka.GroupIdNotFound) {
				err = res.Error
			}
			p.mu.Lock()
			if err != nil {
				p.errs++
			} else {
				s := sample{at: at, committed: make([]int64, partitions)}
				for _, po := range res.Topics[topic] {
					if po.Error == nil && po.CommittedOffset > 0 && po.Partition < partitions {
						s.committed[po.Partition] = po.CommittedOffset
					}
				}
				p.samples = append(p.samples, s)
			}
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// last returns the latest sample (zero before the first).
func (p *poller) last() sample {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.samples) == 0 {
		return sample{}
	}
	return p.samples[len(p.samples)-1]
}

// snapshot returns the samples so far, in time order; the caller must
// not modify them.
func (p *poller) snapshot() []sample {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.samples[:len(p.samples):len(p.samples)]
}

// finish stops polling and returns the samples, in time order.
func (p *poller) finish() []sample {
	p.stop()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.samples
}

// throughput is a rate measured from the committed-offset timeline.
type throughput struct {
	// Rate is events/s between the first and the last advance; the
	// default mode replaces it with the rate of its measured window
	// (backlogPhase), which the 1 s commit ticks do not quantise.
	Rate      float64
	Committed int64         // events committed in all (until the end of the window)
	Window    time.Duration // first advance to last advance
	PollEvery time.Duration // mean interval between samples
}

// measureThroughput computes the rate from the first committed-offset
// advance to the last one at or before until (zero: no limit). Events
// covered by the first advance were processed before the window opened,
// so they are not counted: rate = (C_last - C_first) / (t_last - t_first).
func measureThroughput(samples []sample, until time.Time) throughput {
	var first, last *sample
	for i := range samples {
		s := &samples[i]
		if !until.IsZero() && s.at.After(until) {
			break
		}
		if s.total() == 0 {
			continue
		}
		if first == nil {
			first = s
		}
		if last == nil || s.total() > last.total() {
			last = s
		}
	}
	var t throughput
	if n := len(samples); n > 1 {
		t.PollEvery = samples[n-1].at.Sub(samples[0].at) / time.Duration(n-1)
	}
	if first == nil {
		return t
	}
	t.Committed = last.total()
	t.Window = last.at.Sub(first.at)
	if t.Window > 0 {
		t.Rate = float64(last.total()-first.total()) / t.Window.Seconds()
	}
	return t
}

// record is a produced record as read back from the topic.
type record struct {
	partition int
	offset    int64
	time      time.Time // the producer's timestamp: the send time
	orderID   int64
}

// commitLatencies returns, for each record, the time from its send to the first
// sample in which its partition's committed offset had passed it, sorted
// ascending, and how many records no sample saw committed.
func commitLatencies(samples []sample, recs []record) ([]time.Duration, int) {
	var out []time.Duration
	missing := 0
	for _, r := range recs {
		i, _ := slices.BinarySearchFunc(samples, r.offset, func(s sample, off int64) int {
			if s.committed[r.partition] > off {
				return 1
			}
			return -1
		})
		if i == len(samples) {
			missing++
			continue
		}
		out = append(out, samples[i].at.Sub(r.time))
	}
	slices.Sort(out)
	return out, missing
}

// percentile returns the q-quantile (0 < q <= 1) of sorted, nearest rank.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
