package metrics

import "github.com/prometheus/client_golang/prometheus"

// SynchronousCommitSettings are the values of Postgres' synchronous_commit,
// each a series of billing_postgres_synchronous_commit from the first
// scrape.
var SynchronousCommitSettings = []string{"on", "remote_apply", "remote_write", "local", "off"}

// Durability holds the gauges of what the service's database role can see
// of the ledger's durability, read at startup: the database's
// synchronous_commit and its synchronous standbys. A failover onto an
// asynchronous standby loses the commits it had not received
// (docs/operations.md, Durability requirement). Safe for concurrent use.
type Durability struct {
	// synchronousCommit is billing_postgres_synchronous_commit{setting}:
	// 1 for the setting read, 0 for the others (all 0 before the read).
	synchronousCommit *prometheus.GaugeVec
	// syncStandbys is billing_postgres_sync_standbys: the standbys the
	// primary streams to synchronously (sync or quorum), -1 when unknown
	// (before the read, or the role may not see pg_stat_replication's
	// details: it lacks pg_read_all_stats).
	syncStandbys prometheus.Gauge
}

// NewDurability creates the durability gauges and registers them on reg,
// every setting at 0 and the standbys at -1 (unknown) until Set.
func NewDurability(reg prometheus.Registerer) *Durability {
	d := &Durability{
		synchronousCommit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: PostgresSynchronousCommit, Help: "1 for the database's synchronous_commit setting as this replica read it at startup, 0 for the others.",
		}, []string{"setting"}),
		syncStandbys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: PostgresSyncStandbys, Help: "Standbys the database streams to synchronously (pg_stat_replication sync_state sync or quorum), as read at startup; -1 when unknown (the role cannot see it).",
		}),
	}
	for _, s := range SynchronousCommitSettings {
		d.synchronousCommit.WithLabelValues(s)
	}
	d.syncStandbys.Set(-1)
	reg.MustRegister(d.synchronousCommit, d.syncStandbys)
	return d
}

// Set records what was read: the synchronous_commit setting (a value
// outside SynchronousCommitSettings gets a series of its own) and the
// synchronous standbys, -1 when unknown.
func (d *Durability) Set(synchronousCommit string, syncStandbys int) {
	d.synchronousCommit.Reset()
	for _, s := range SynchronousCommitSettings {
		d.synchronousCommit.WithLabelValues(s)
	}
	d.synchronousCommit.WithLabelValues(synchronousCommit).Set(1)
	d.syncStandbys.Set(float64(syncStandbys))
}
