package main

import (
	"context"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

func TestDurabilityWeak(t *testing.T) {
	for _, c := range []struct {
		d    postgres.Durability
		weak bool
	}{
		{postgres.Durability{SynchronousCommit: "on", SyncStandbys: 1}, false},
		{postgres.Durability{SynchronousCommit: "remote_apply", SyncStandbys: 1}, false},
		{postgres.Durability{SynchronousCommit: "on", SyncStandbys: 0}, true},
		{postgres.Durability{SynchronousCommit: "local", SyncStandbys: 1}, true},
		{postgres.Durability{SynchronousCommit: "off", SyncStandbys: 1}, true},
		{postgres.Durability{SynchronousCommit: "on", SyncStandbys: -1}, false}, // unknown: not claimed weak
	} {
		if got := weak(c.d); got != c.weak {
			t.Errorf("%+v weak = %v, want %v", c.d, got, c.weak)
		}
	}
}

// TestReadDurability reads the scratch cluster of make test, which has no
// standby: synchronous_commit on (scripts/pg.sh), no synchronous standby.
// (TestFailover in e2e reads a real synchronous one.)
func TestReadDurability(t *testing.T) {
	pool := pgtest.Open(t, pgtest.NewDatabase(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := postgres.ReadDurability(ctx, postgres.FromPool(pool))
	if err != nil {
		t.Fatal(err)
	}
	if d.SynchronousCommit != "on" || d.SynchronousStandbyNames != "" || d.SyncStandbys != 0 {
		t.Errorf("read %+v, want synchronous_commit on, no synchronous_standby_names, 0 sync standbys", d)
	}
	if !weak(d) {
		t.Errorf("%+v is not weak; a primary without a synchronous standby is", d)
	}
}
