package consumer

import (
	"testing"
	"time"
	"unsafe"
)

// A partition tracks every message done behind a waiting one (trackedPerWindow
// windows of them): each entry must stay 32 bytes, so that the bound holds
// 32 Ki messages in 1 MiB.
func TestTrackedEntryIs32Bytes(t *testing.T) {
	if n := unsafe.Sizeof(pendingMsg{}); n != 32 {
		t.Fatalf("a tracked message takes %d bytes; want 32 (trackedPerWindow is sized for it)", n)
	}
}

// The timings handed to the committer are those recorded at the fetch, to
// the nanosecond; a record without a timestamp keeps the zero time (the
// event-age histogram skips it).
func TestTrackedTimingsRoundTrip(t *testing.T) {
	o := newOffsets()
	fetched := time.Now()
	produced := fetched.Add(-1500 * time.Millisecond)
	o.fetched(10, Timing{Produced: produced, Fetched: fetched})
	o.fetched(11, Timing{Fetched: fetched})
	got := o.done(11, nil)
	if len(got) != 0 {
		t.Fatalf("offset 11 done behind 10: %d timings advanced; want none", len(got))
	}
	got = o.done(10, nil)
	if len(got) != 2 {
		t.Fatalf("%d timings advanced; want 2", len(got))
	}
	if !got[0].Produced.Equal(produced) || !got[0].Fetched.Equal(fetched) {
		t.Errorf("timing of offset 10 = %v / %v; want %v / %v", got[0].Produced, got[0].Fetched, produced, fetched)
	}
	if !got[1].Produced.IsZero() || !got[1].Fetched.Equal(fetched) {
		t.Errorf("timing of offset 11 = %v / %v; want the zero time / %v", got[1].Produced, got[1].Fetched, fetched)
	}
	if next, ahead := o.committable(); !ahead || next != 12 {
		t.Errorf("committable = %d, %v; want 12, true", next, ahead)
	}
}
