// Package postgres is billing-consumer's Postgres adapter: it implements
// the storage ports the other packages declare, and is the one package
// (with its subpackages dedup, pause and pglock, and cmd's wiring) that
// imports pgx (issue 32). It holds:
//
//   - billing's ports (billing.Store, billing.Tx, billing.Sessions and
//     billing.OperatorStore): Store and Sessions, with the ledger's claim
//     statements in claims.go, the deferred events', parked claims' and
//     dead letters' in deferred.go, the charge and settle transactions'
//     in tx.go, the completer's session in session.go and the operator's
//     commands in operator.go; classifyDB gives their errors a fault.Kind;
//   - the consumer's positions (consumer.Positions, the consumer_position
//     table of migration 00013), positions.go;
//   - dedup (processed_event and its partitions), pause (the operator's
//     pause) and pglock (advisory locks).
package postgres
