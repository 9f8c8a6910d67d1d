package postgres

// What the service's database role can see of the ledger's durability
// (docs/operations.md, Durability requirement).

import "context"

// Durability is whether a commit the service is told of has reached a
// standby that a failover would promote, as the role can see it.
type Durability struct {
	// SynchronousCommit and SynchronousStandbyNames are the settings of
	// the role's sessions (readable by any role).
	SynchronousCommit, SynchronousStandbyNames string
	// SyncStandbys counts the standbys pg_stat_replication shows in
	// sync_state sync or quorum; -1 when the role may not see the column
	// (without pg_read_all_stats, other roles' walsenders show no details).
	SyncStandbys int
}

// durabilitySQL reads Durability in one statement. hidden counts the
// walsenders whose details the role may not see.
const durabilitySQL = `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')), count(*) FILTER (WHERE sync_state IS NULL)
FROM pg_stat_replication`

// ReadDurability runs durabilitySQL on db.
func ReadDurability(ctx context.Context, db *DB) (Durability, error) {
	var d Durability
	var sync, hidden int
	err := db.pool.QueryRow(ctx, durabilitySQL).Scan(&d.SynchronousCommit, &d.SynchronousStandbyNames, &sync, &hidden)
	d.SyncStandbys = syncStandbys(sync, hidden)
	return d, err
}

// syncStandbys is the synchronous standbys seen: sync, or -1 (unknown)
// when some walsender's state is hidden from the role.
func syncStandbys(sync, hidden int) int {
	if hidden > 0 {
		return -1
	}
	return sync
}
