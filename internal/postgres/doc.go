// Package postgres is billing-consumer's Postgres adapter: it implements
// the storage ports the other packages declare, and it and its
// subpackages (dedup, pause, pglock, migrate) are the only production code
// that imports pgx (issue 32; cmd/billing-bench, a measurement tool, and
// the test kits aside). It holds:
//
//   - DB, the handle the program holds instead of a pgx pool: Open and
//     Connect make it, every constructor below takes it (db.go);
//   - billing's ports (billing.Store, billing.Tx, billing.Sessions and
//     billing.OperatorStore): Store and Sessions, with the ledger's claim
//     statements in claims.go, the deferred events', parked claims' and
//     dead letters' in deferred.go, the charge and settle transactions'
//     in tx.go, the completer's session in session.go and the operator's
//     commands in operator.go; classifyDB gives their errors a fault.Kind;
//   - the consumer's positions (consumer.Positions, the consumer_position
//     table of migration 00013), positions.go; the failover heal's gate,
//     heal.go;
//   - the entry points, on a DB, to its subpackages: migrate (the
//     migrations and the replicas' registration, schema.go), pause
//     (pausing.go) and dedup's partition maintenance (partitions.go);
//   - what the service reads of the server: its durability settings
//     (durability.go).
package postgres
