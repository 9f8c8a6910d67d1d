package consumer

// A partition's queues (its ready records, the records waiting behind
// each key, its offsets entries, the workers' verdicts) are slices that a burst grows: a large record batch
// decoded at once puts thousands of records in one partition. The budget
// charges the records, not the arrays; an array kept at its burst's size
// after the records left would stay with the partition, quiet or not,
// outside the budget and times the owned partitions (a heap profile at 160
// partitions with 1 MiB producer batches: 33 of 65 MB live at the end of a
// drain were such arrays, the ready queues' alone 18 MB). So each queue
// gives its array back once it holds less than a quarter of it: what the
// queues hold stays within a constant of what the budget charges, whatever
// the partition count.

// queueKeep is the capacity a queue keeps however little it holds, so that
// a partition trickling a record at a time does not allocate for each.
const queueKeep = 64

// fifo is a queue in one slice, taken from the front, whose array follows
// what it holds (see above). The zero value is empty and ready to use.
type fifo[T any] struct {
	buf  []T // the items are buf[head:]
	head int
}

// Len is the number of items.
func (q *fifo[T]) Len() int { return len(q.buf) - q.head }

// Items are the items, oldest first; valid until the next change.
func (q *fifo[T]) Items() []T { return q.buf[q.head:] }

// Push adds x at the back, reusing the room the front left before it grows
// the array.
func (q *fifo[T]) Push(x T) {
	if len(q.buf) == cap(q.buf) && q.head >= len(q.buf)/2 {
		q.compact(cap(q.buf))
	}
	q.buf = append(q.buf, x)
}

// Insert puts x at index i of Items.
func (q *fifo[T]) Insert(i int, x T) {
	q.Push(x) // room for one more, then shift
	items := q.Items()
	copy(items[i+1:], items[i:len(items)-1])
	items[i] = x
}

// Pop drops the n oldest items, and the array with them once it is mostly
// empty.
func (q *fifo[T]) Pop(n int) {
	clear(q.buf[q.head : q.head+n]) // what they point to is done with
	q.head += n
	switch n := q.Len(); {
	case n == 0 && cap(q.buf) <= queueKeep:
		q.buf, q.head = q.buf[:0], 0
	case n == 0: // a quiet partition holds no array
		q.buf, q.head = nil, 0
	case cap(q.buf) > queueKeep && 4*n < cap(q.buf):
		q.compact(max(queueKeep, 2*n))
	}
}

// compact moves the items to the front of an array of capacity size: the
// same one when it is the same size, else a new one.
func (q *fifo[T]) compact(size int) {
	items := q.Items()
	if size == cap(q.buf) {
		n := copy(q.buf, items)
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
		return
	}
	q.buf, q.head = append(make([]T, 0, size), items...), 0
}

// emptied returns s emptied for reuse: s[:0] with its items cleared, or nil
// when its array is larger than queueKeep (the next use grows a new one),
// for a scratch slice that is filled and emptied whole.
func emptied[T any](s []T) []T {
	if cap(s) > queueKeep {
		return nil
	}
	clear(s)
	return s[:0]
}
