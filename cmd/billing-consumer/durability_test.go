package main

import (
	"context"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

func TestSyncStandbys(t *testing.T) {
	for _, c := range []struct{ sync, hidden, want int }{
		{0, 0, 0},  // no standby, or none synchronous
		{1, 0, 1},  // one synchronous standby
		{2, 0, 2},  // quorum
		{0, 1, -1}, // a walsender whose state the role may not see
		{1, 1, -1},
	} {
		if got := syncStandbys(c.sync, c.hidden); got != c.want {
			t.Errorf("syncStandbys(%d sync, %d hidden) = %d, want %d", c.sync, c.hidden, got, c.want)
		}
	}
}

func TestDurabilityWeak(t *testing.T) {
	for _, c := range []struct {
		d    durability
		weak bool
	}{
		{durability{synchronousCommit: "on", syncStandbys: 1}, false},
		{durability{synchronousCommit: "remote_apply", syncStandbys: 1}, false},
		{durability{synchronousCommit: "on", syncStandbys: 0}, true},
		{durability{synchronousCommit: "local", syncStandbys: 1}, true},
		{durability{synchronousCommit: "off", syncStandbys: 1}, true},
		{durability{synchronousCommit: "on", syncStandbys: -1}, false}, // unknown: not claimed weak
	} {
		if got := c.d.weak(); got != c.weak {
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
	d, err := readDurability(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if d.synchronousCommit != "on" || d.synchronousStandbyNames != "" || d.syncStandbys != 0 {
		t.Errorf("read %+v, want synchronous_commit on, no synchronous_standby_names, 0 sync standbys", d)
	}
	if !d.weak() {
		t.Errorf("%+v is not weak; a primary without a synchronous standby is", d)
	}
}
