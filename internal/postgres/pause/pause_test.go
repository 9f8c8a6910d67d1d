package pause_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/postgres/pause"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

func isOpen(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// The gate is closed until the first read, then follows the group's row:
// pause closes it (only for that group), resume opens it; pausing again
// keeps the first since; a failed read keeps the last state.
func TestWatcherFollowsThePause(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	var states []pause.State
	w := &pause.Watcher{Pool: pool, Group: "g1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnState: func(s pause.State) { states = append(states, s) }}
	if isOpen(w.Gate()) {
		t.Fatal("gate open before the first read")
	}
	if _, known := w.State(); known {
		t.Fatal("state known before the first read")
	}
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !isOpen(w.Gate()) {
		t.Fatal("gate closed while not paused")
	}
	first, err := pause.Set(ctx, pool, "g1", "INC-1", "alice", "pod-a")
	if err != nil || !first.Paused || first.Reason != "INC-1" {
		t.Fatalf("Set = %+v, %v", first, err)
	}
	if _, err := pause.Set(ctx, pool, "g2", "other group", "bob", ""); err != nil {
		t.Fatal(err)
	}
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	gate := w.Gate()
	if isOpen(gate) {
		t.Fatal("gate open while paused")
	}
	again, err := pause.Set(ctx, pool, "g1", "INC-1 still", "carol", "pod-b")
	if err != nil || !again.Since.Equal(first.Since) || again.Operator != "carol" {
		t.Fatalf("second Set = %+v, %v; want the first since (%v) and the latest operator", again, err, first.Since)
	}
	ended, err := pause.Clear(ctx, pool, "g1")
	if err != nil || !ended.Paused || ended.Reason != "INC-1 still" {
		t.Fatalf("Clear = %+v, %v", ended, err)
	}
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !isOpen(gate) || !isOpen(w.Gate()) {
		t.Fatal("resume did not open the gate a waiter holds")
	}
	if s, _ := pause.Get(ctx, pool, "g2"); !s.Paused {
		t.Fatal("the other group's pause was lost")
	}
	if ended, err := pause.Clear(ctx, pool, "g1"); err != nil || ended.Paused {
		t.Fatalf("Clear of a group not paused = %+v, %v; want the zero state", ended, err)
	}
	pool.Close()
	if err := w.Refresh(ctx); err == nil {
		t.Fatal("Refresh on a closed pool succeeded")
	}
	if !isOpen(w.Gate()) {
		t.Fatal("a failed read changed the gate")
	}
	if len(states) != 3 || states[0].Paused || !states[1].Paused || states[2].Paused {
		t.Fatalf("OnState calls = %+v", states)
	}
}
