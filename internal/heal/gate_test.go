package heal

import (
	"context"
	"io"
	"log/slog"
	"testing"
)

// fakeStore is a Store in memory.
type fakeStore struct {
	gate      map[int]Range
	positions map[int]int64
}

func (f *fakeStore) Gate(context.Context) (map[int]Range, error)      { return f.gate, nil }
func (f *fakeStore) Positions(context.Context) (map[int]int64, error) { return f.positions, nil }
func (f *fakeStore) Install(_ context.Context, r map[int]Range, _ []Suspect, _ string, _ Window) (map[int]Range, int, bool, error) {
	if f.gate != nil {
		return f.gate, 0, false, nil
	}
	f.gate = r
	return r, 0, true, nil
}
func (f *fakeStore) Lift(context.Context) (bool, error) {
	for id, r := range f.gate {
		if p, ok := f.positions[id]; !ok || p < r.Hi {
			return false, nil
		}
	}
	f.gate = nil
	return true, nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestGateUpHoldsRewindsAndLifts(t *testing.T) {
	ups := 0
	h := New(Config{Logger: quiet(), OnUp: func() { ups++ }})
	st := &fakeStore{gate: map[int]Range{0: {Lo: 100, Hi: 340, Committed: 300}}, positions: map[int]int64{0: 100}}
	ctx := context.Background()
	if h.Hold(0, 1000) || h.Start(0, 300) != 300 {
		t.Fatal("the gate is down: nothing held, nothing rewound")
	}
	changed := h.Changed()
	if err := h.Check(ctx, st, "s1"); err != nil { // the gate another replica installed
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed when the gate went up")
	}
	if ups != 1 || !h.Up() {
		t.Fatalf("OnUp ran %d times, Up %v; want once, true", ups, h.Up())
	}
	if h.Hold(0, 339) || !h.Hold(0, 340) || !h.Hold(1, 0) {
		t.Error("want: below Hi re-decided, at Hi held, a partition without a range held")
	}
	if got := h.Start(0, 300); got != 100 {
		t.Errorf("Start(0, 300) = %d, want the range's Lo 100", got)
	}
	if err := h.Check(ctx, st, "s1"); err != nil || ups != 1 {
		t.Fatalf("a second connection: err %v, OnUp %d times; want once", err, ups)
	}
	st.positions[0] = 340
	if err := h.Watch(ctx, st); err != nil {
		t.Fatal(err)
	}
	if h.Up() || h.Hold(0, 1000) || h.Start(0, 300) != 300 {
		t.Error("every position at its target: the watch must lift the gate")
	}
}

func TestHealedPartitionIsNotRewoundAgain(t *testing.T) {
	h := New(Config{Logger: quiet()})
	st := &fakeStore{gate: map[int]Range{0: {Lo: 100, Hi: 340}, 1: {Lo: 10, Hi: 90}}, positions: map[int]int64{0: 340, 1: 20}}
	if err := h.Watch(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if !h.Up() || h.Start(0, 340) != 340 || h.Start(1, 30) != 10 {
		t.Errorf("Up %v, Start(0) %d, Start(1) %d; want up, 340 (healed), 10", h.Up(), h.Start(0, 340), h.Start(1, 30))
	}
}

func TestGuardSkipsAndCancelsBillingPasses(t *testing.T) {
	h := New(Config{Logger: quiet()})
	st := &fakeStore{gate: map[int]Range{0: {Lo: 1, Hi: 2}}}
	ran := 0
	pass := h.Guard(func(ctx context.Context) error {
		ran++
		if err := h.Check(ctx, st, "s1"); err != nil { // the gate goes up under the pass
			return err
		}
		if ctx.Err() == nil {
			t.Error("the pass's context must end when the gate goes up")
		}
		return nil
	})
	if err := pass(context.Background()); err != nil || ran != 1 {
		t.Fatalf("err %v, ran %d", err, ran)
	}
	if err := pass(context.Background()); err != nil || ran != 1 {
		t.Fatalf("while the gate is up the pass must be skipped: ran %d", ran)
	}
}
