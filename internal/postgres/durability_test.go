package postgres

import "testing"

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
