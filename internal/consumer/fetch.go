package consumer

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// fetchedMsg is a fetched record and what the budget charged for it.
type fetchedMsg struct {
	msg  kafka.Message
	cost int64
}

// fetchRetry is the wait after a failed fetch or dial before the next.
const fetchRetry = 250 * time.Millisecond

// fetchTimeout bounds one read from the broker: a fetch's response (beyond
// the broker's kafkagroup.FetchMaxWait) or the next record of one.
const fetchTimeout = 10 * time.Second

// fetch reads the partition from offset in its own goroutine, so that
// completions and interval commits go on while no record arrives, and
// hands over each record charged to the budget (see fetcher). stopFetch
// ends it and waits for it; it closes the partition's connection.
func (p *partitionState) fetch(offset int64) (<-chan fetchedMsg, func()) {
	fetched := make(chan fetchedMsg)
	ctx, cancel := context.WithCancel(p.stop)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer close(fetched)
		f := &fetcher{p: p, out: fetched, next: offset}
		defer f.close()
		f.run(ctx)
	}()
	return fetched, func() { cancel(); <-finished }
}

// fetcher reads one partition through its own connection to the leader,
// one fetch at a time, and bounds what its fetches hold by the budget:
//
//   - A fetch asks for at most the budget's fetchBytes; the response waits
//     in the socket, not in memory, until the fetcher decodes it.
//   - Only a holder of one of the budget's slots decodes a response (a
//     compressed record batch is held whole, decompressed, while its
//     records are read). An empty response takes no slot, so a quiet
//     partition's long poll holds none.
//   - While it holds a slot the fetcher never waits for the budget: it
//     hands over each record that fits at once (from its credit, its
//     share, or the pool when no partition waits for it). At the first
//     that does not, it drops the rest of the response (Kafka keeps the
//     records), gives the slot back, and only then waits for credit (see
//     budget.reserve): room for a maximal record from the pool, in FIFO
//     order; or, when shares are worth a fetch (budget.worthAFetch) or
//     once the pool has lent nothing for a while (stuck records hold it,
//     see budget.stalled), what its own releases leave of its share once
//     that holds the larger of the record and budget.refill (half the
//     share), whichever comes first.
//     The next fetch, from that record, spends the credit first: a
//     backlog is decoded again about once per credit's worth of records,
//     not once per record; with small shares, once per maximal record's
//     worth, not once per share (at 160 partitions a share is about 30
//     records of a producer's 1 MiB batch: waiting for the share decoded
//     each batch 25 times). A slot thus passes on after one response's
//     decoding whatever the budget does, and a record larger than the
//     share is fetched once its credit is granted.
//
// Only the partition's fetch goroutine uses a fetcher.
type fetcher struct {
	p      *partitionState
	out    chan<- fetchedMsg
	conn   *kafka.Conn
	stopAF func() bool // stops closing conn when the fetch's context ends
	next   int64       // offset of the next record to fetch
	credit int64       // charged to the partition for records not yet fetched
	// size and cost are the bytes and the cost of the last record handed
	// over: what a credit's worth of records weighs on the wire (see
	// askBytes).
	size, cost int64
	// behind is whether the last fetch saw records at or after next: the
	// next fetch takes its slot before it asks.
	behind bool
	// held is set when the fetch stopped at a record the Gate holds that
	// its share has no room for: the next fetch waits for the Gate's
	// change (see admit).
	held <-chan struct{}
}

// run fetches until ctx ends or a pause that began holds the partition.
func (f *fetcher) run(ctx context.Context) {
	for f.p.gateOpen(ctx) {
		err := f.fetchOnce(ctx)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		f.p.log.Warn("fetch failed", "offset", f.next, "err", err)
		f.close()
		select {
		case <-ctx.Done():
			return
		case <-time.After(fetchRetry):
		}
	}
}

// close closes the connection, if any, and gives back the credit.
func (f *fetcher) close() {
	f.p.budget.release(f.p.partition, f.credit)
	f.credit = 0
	if f.conn != nil {
		f.stopAF()
		_ = f.conn.Close()
		f.conn = nil
	}
}

// fetchOnce fetches from f.next and hands over what fits (see fetcher).
func (f *fetcher) fetchOnce(ctx context.Context) error {
	if err := f.dial(ctx); err != nil {
		return err
	}
	b := f.p.budget
	// With records known to wait, the slot comes first and the broker
	// answers at once; otherwise the long poll holds none.
	slot, wait := f.behind, kafkagroup.FetchMaxWait
	if slot {
		select {
		case <-b.slots:
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = behindMaxWait
	}
	_ = f.conn.SetReadDeadline(time.Now().Add(wait + fetchTimeout))
	batch := f.conn.ReadBatchWith(kafka.ReadBatchConfig{MinBytes: 1, MaxBytes: f.askBytes(), MaxWait: wait})
	err := batch.Err()
	f.behind = err == nil && batch.HighWaterMark() > f.next
	if !f.behind || !slot && !f.trySlot() {
		// Empty, failed, or no slot free: kafka-go's batch holds a
		// buffer of its pool (grown by earlier batches) until closed,
		// so it is not kept waiting; a response dropped here is
		// fetched again under a slot.
		_ = batch.Close()
		if slot {
			b.slots <- struct{}{}
		}
		return f.fetchError(err)
	}
	need, err := f.handOver(ctx, batch)
	b.slots <- struct{}{}
	f.behind = batch.HighWaterMark() > f.next
	if err != nil {
		return err
	}
	if changed := f.held; changed != nil {
		f.held = nil
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if need == 0 {
		return nil
	}
	got, err := b.reserve(ctx, f.p.partition, max(need, b.refill()), b.maxCost)
	f.credit += got
	return err
}

// askBytes is what the next fetch asks the broker for: the budget's
// fetchBytes, or with a credit to spend about the bytes of the records it
// pays for (at least minFetchBytes): a response larger than what the
// partition may take is decoded to the first record that does not fit
// and the rest dropped, which would cost a backlog's drain the decoding
// of most of each response again.
func (f *fetcher) askBytes() int {
	full := f.p.budget.fetchBytes
	if f.credit <= 0 || f.cost <= 0 {
		return full
	}
	return int(min(int64(full), max(f.credit/f.cost*f.size, minFetchBytes)))
}

// behindMaxWait is the broker's wait for a fetch that expects records: it
// holds a slot.
const behindMaxWait = 10 * time.Millisecond

// trySlot takes a slot if one is free.
func (f *fetcher) trySlot() bool {
	select {
	case <-f.p.budget.slots:
		return true
	default:
		return false
	}
}

// handOver hands over the records of batch while each fits the budget at
// once, and closes it. It returns the cost of the record that did not fit
// (the connection is then positioned at it again), 0 when the batch was
// read to its end, a pause began, or a record the Gate holds found no
// room in the share (see admit). Leftover credit is given back: a
// quiet partition holds none.
func (f *fetcher) handOver(ctx context.Context, batch *kafka.Batch) (int64, error) {
	b := f.p.budget
	defer func() {
		b.release(f.p.partition, f.credit)
		f.credit = 0
	}()
	for {
		_ = f.conn.SetReadDeadline(time.Now().Add(fetchTimeout))
		msg, err := batch.ReadMessage()
		if err != nil {
			cerr := batch.Close()
			if !errors.Is(err, io.EOF) {
				return 0, err
			}
			f.next = max(f.next, batch.Offset()) // past records kafka-go skips
			return 0, f.fetchError(cerr)
		}
		cost := b.cost(msg)
		if need, ok := f.admit(msg.Offset, cost); !ok {
			// Not handed over: fetched again once there is room (or
			// the pause ended, or the Gate changed), or redelivered if
			// the partition is revoked meanwhile.
			_ = batch.Close()
			if _, err := f.conn.Seek(msg.Offset, kafka.SeekAbsolute|kafka.SeekDontCheck); err != nil {
				return 0, err
			}
			f.next = msg.Offset
			return need, nil
		}
		select {
		case f.out <- fetchedMsg{msg: msg, cost: cost}:
			f.next = msg.Offset + 1
			f.size, f.cost = max(cost-RecordOverhead, 1), cost
		case <-ctx.Done():
			b.release(f.p.partition, cost)
			_ = batch.Close()
			return 0, ctx.Err()
		}
	}
}

// admit charges the record at offset its cost and reports whether it may
// be handed over; if not, the cost the fetcher waits for (0: none, the
// fetch stops for a pause, or for the Gate's change, see held).
//
// A record the Gate holds is charged to the partition's share only: it
// waits for the heal to lift, which waits for every other partition to
// reach its target, and a held partition that borrowed the pool would
// keep a record of another larger than its share from ever being fetched
// (a deadlock: the gate never lifts).
func (f *fetcher) admit(offset, cost int64) (int64, bool) {
	if f.p.pausedGate() != nil {
		return 0, false
	}
	if changed := f.p.heldAt(offset); changed != nil {
		f.p.budget.release(f.p.partition, f.credit) // it may come from the pool
		f.credit = 0
		if f.p.budget.tryShare(f.p.partition, cost) {
			return 0, true
		}
		f.held = changed
		return 0, false
	}
	if f.take(cost) {
		return 0, true
	}
	return cost, false
}

// take charges cost from the credit, else from the budget if that takes
// no waiting, and reports whether it did.
func (f *fetcher) take(cost int64) bool {
	if f.credit >= cost {
		f.credit -= cost
		return true
	}
	return f.p.budget.tryAcquire(f.p.partition, cost)
}

// dial connects to the partition's leader at f.next unless connected; the
// connection closes when ctx ends, which ends a fetch under way.
func (f *fetcher) dial(ctx context.Context) error {
	if f.conn != nil {
		return nil
	}
	c := f.p.c.cfg
	conn, start, err := kafkagroup.DialPartition(ctx, kafkagroup.ReaderConfig{Brokers: c.Brokers, Topic: c.Topic,
		Partition: f.p.partition, Dialer: c.Dialer}, f.next)
	if err != nil {
		return err
	}
	f.conn, f.next = conn, start
	f.stopAF = context.AfterFunc(ctx, func() { _ = conn.Close() })
	return nil
}

// fetchError is what a fetch's error means for the next one: nil when the
// next fetch may simply follow (none, or the broker's wait timed out); an
// offset before the first retained record moves to it, as a kafka-go
// Reader does; the rest are returned (the caller reconnects).
func (f *fetcher) fetchError(err error) error {
	switch {
	case err == nil, errors.Is(err, kafka.RequestTimedOut):
		return nil
	case errors.Is(err, kafka.OffsetOutOfRange):
		_ = f.conn.SetDeadline(time.Now().Add(fetchTimeout))
		first, _, oerr := f.conn.ReadOffsets()
		_ = f.conn.SetDeadline(time.Time{})
		if oerr != nil || f.next >= first {
			return errors.Join(err, oerr) // past the end: retried after a wait
		}
		f.p.log.Warn("offset before the first retained record: skipping to it", "offset", f.next, "first", first)
		f.next = first
		_, err = f.conn.Seek(first, kafka.SeekAbsolute|kafka.SeekDontCheck)
		return err
	}
	return err
}
