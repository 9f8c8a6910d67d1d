package dlq

import (
	"errors"
	"testing"
)

// Marking records out of order keeps exactly those records replayed, the
// first not replayed one as the committed offset, and survives the
// metadata round trip.
func TestPositionMarks(t *testing.T) {
	p := NewPosition(10, "")
	for _, o := range []int64{12, 13, 20, 11, 15} {
		if err := p.Mark(o); err != nil {
			t.Fatal(err)
		}
	}
	// 10 not replayed: Next stays; 11..13, 15, 20 replayed.
	if p.Next != 10 {
		t.Fatalf("Next %d, want 10", p.Next)
	}
	q := NewPosition(p.Next, p.Metadata())
	for o := int64(0); o < 25; o++ {
		want := o < 10 || (o >= 11 && o <= 13) || o == 15 || o == 20
		if p.Replayed(o) != want || q.Replayed(o) != want {
			t.Errorf("offset %d: replayed %t (after round trip %t), want %t", o, p.Replayed(o), q.Replayed(o), want)
		}
	}
	if n := q.ReplayedIn(10, 25); n != 5 {
		t.Errorf("ReplayedIn(10,25) = %d, want 5", n)
	}
	if err := p.Mark(10); err != nil {
		t.Fatal(err)
	}
	if p.Next != 14 || p.Metadata() == "" {
		t.Errorf("after marking 10: Next %d metadata %q, want 14 and the rest kept", p.Next, p.Metadata())
	}
	p.Start(16)
	if p.Next != 16 || !p.Replayed(20) || p.Replayed(17) {
		t.Errorf("after Start(16): Next %d, 20 replayed %t, 17 replayed %t", p.Next, p.Replayed(20), p.Replayed(17))
	}
}

// Metadata of an older release (or anything not ours) means only the
// offset; a position too scattered for one commit refuses the mark and
// stays as it was.
func TestPositionForeignAndScattered(t *testing.T) {
	for _, md := range []string{"", "whatever", "r1:zz", "r1:0.1", "r1:1.0", "r1:1.1,"} {
		p := NewPosition(7, md)
		if p.Next != 7 || p.Replayed(8) || p.Metadata() != "" {
			t.Errorf("metadata %q: %+v", md, p)
		}
	}
	p := NewPosition(0, "")
	var err error
	o := int64(1)
	for ; err == nil; o += 2 {
		err = p.Mark(o)
	}
	if !errors.Is(err, ErrScattered) {
		t.Fatalf("err %v, want ErrScattered", err)
	}
	if len(p.Metadata()) > MaxMetadata || p.Replayed(o-2) {
		t.Errorf("refused mark changed the position: %d bytes, %d replayed %t", len(p.Metadata()), o-2, p.Replayed(o-2))
	}
}
