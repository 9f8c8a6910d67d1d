package metrics

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestDurabilityGauges: before the read every synchronous_commit setting
// is at 0 and the standbys unknown (-1); Set marks the setting read (one
// at 1, the known others at 0, an unexpected one gets its series) and the
// standbys.
func TestDurabilityGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := NewDurability(reg)
	want := func(commit map[string]int, standbys int) string {
		var b strings.Builder
		b.WriteString("# HELP billing_postgres_sync_standbys Standbys the database streams to synchronously (pg_stat_replication sync_state sync or quorum), as read at startup; -1 when unknown (the role cannot see it).\n")
		b.WriteString("# TYPE billing_postgres_sync_standbys gauge\n")
		b.WriteString("billing_postgres_sync_standbys " + strconv.Itoa(standbys) + "\n")
		b.WriteString("# HELP billing_postgres_synchronous_commit 1 for the database's synchronous_commit setting as this replica read it at startup, 0 for the others.\n")
		b.WriteString("# TYPE billing_postgres_synchronous_commit gauge\n")
		for _, s := range []string{"local", "off", "on", "remote_apply", "remote_write", "weird"} {
			if v, ok := commit[s]; ok {
				b.WriteString(`billing_postgres_synchronous_commit{setting="` + s + `"} ` + strconv.Itoa(v) + "\n")
			}
		}
		return b.String()
	}
	zero := map[string]int{"on": 0, "remote_apply": 0, "remote_write": 0, "local": 0, "off": 0}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(zero, -1))); err != nil {
		t.Errorf("first scrape: %v", err)
	}
	d.Set("remote_apply", 1)
	got := map[string]int{"on": 0, "remote_apply": 1, "remote_write": 0, "local": 0, "off": 0}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(got, 1))); err != nil {
		t.Errorf("after Set(remote_apply, 1): %v", err)
	}
	d.Set("weird", -1)
	got = map[string]int{"on": 0, "remote_apply": 0, "remote_write": 0, "local": 0, "off": 0, "weird": 1}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(got, -1))); err != nil {
		t.Errorf("after Set(weird, -1): %v", err)
	}
}
