package heal

import (
	"context"
	"maps"
)

// set makes gate this replica's view (nil: down). On the way up it
// cancels the running Guard passes and calls OnUp before returning.
func (h *Healer) set(gate map[int]Range) { h.apply(gate, nil) }

// apply is set; with seen, a nil gate lowers the view only if it has not
// gone up since seen (under the same lock as the raise).
func (h *Healer) apply(gate map[int]Range, seen *uint64) {
	h.mu.Lock()
	if gate == nil && seen != nil && h.raised != *seen {
		h.mu.Unlock()
		return
	}
	wasUp := h.ranges != nil
	var cancels []context.CancelFunc
	switch {
	case gate != nil && !wasUp:
		h.ranges, h.healed = gate, map[int]bool{}
		h.up.Store(true)
		h.raised++
		for _, c := range h.passes {
			cancels = append(cancels, c)
		}
	case gate == nil && wasUp:
		h.ranges, h.healed = nil, nil
		h.up.Store(false)
	case gate != nil && !maps.Equal(gate, h.ranges):
		// Another heal (lifted and installed again between two reads):
		// as if the gate went up.
		h.ranges, h.healed = gate, map[int]bool{}
		h.raised++
		for _, c := range h.passes {
			cancels = append(cancels, c)
		}
	case gate != nil:
		h.mu.Unlock() // the same heal; healed stays
		return
	default:
		h.mu.Unlock()
		return
	}
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()

	for _, c := range cancels {
		c()
	}
	if gate != nil && h.cfg.OnUp != nil {
		h.cfg.OnUp()
	}
}

// raises returns how many times the gate went up so far.
func (h *Healer) raises() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.raised
}

// lower lowers this replica's view of the gate, read as down when raises
// was seen, unless it went up since: that read is stale.
func (h *Healer) lower(seen uint64) { h.apply(nil, &seen) }

// Up reports whether the gate is up on this replica.
func (h *Healer) Up() bool { return h.up.Load() }

// Start is the offset partition starts from in a new generation: while
// the gate is up and the partition's range is not re-decided yet, its Lo
// if that is behind the committed offset.
func (h *Healer) Start(partition int, committed int64) int64 {
	if !h.up.Load() {
		return committed
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.ranges[partition]
	if !ok || h.healed[partition] || committed < 0 {
		return committed
	}
	return min(committed, r.Lo)
}

// Hold reports whether the record at offset of partition waits for the
// lift: the gate is up and the record is at or past its range's Hi, or
// the partition has no range (no marked commit: nothing of it is
// re-decided, all of it waits).
func (h *Healer) Hold(partition int, offset int64) bool {
	if !h.up.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.ranges[partition]
	return !ok || offset >= r.Hi
}

// Changed is closed at the gate's next change on this replica.
func (h *Healer) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// Guard wraps a billing loop's pass: it skips the pass while the gate is
// up, and cancels a pass under way when the gate goes up (before the
// connection that saw it is used), so that no loop decides or sends
// while the ranges are re-decided.
func (h *Healer) Guard(pass func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if h.up.Load() {
			return nil
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		h.mu.Lock()
		id := h.nextID
		h.nextID++
		h.passes[id] = cancel
		up := h.ranges != nil
		h.mu.Unlock()
		defer func() {
			h.mu.Lock()
			delete(h.passes, id)
			h.mu.Unlock()
		}()
		if up {
			return nil
		}
		return pass(ctx)
	}
}
