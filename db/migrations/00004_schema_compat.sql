-- +goose Up
-- lowest-compatible-binary: 3

-- Every migration from this one on declares, in a line like the one above,
-- the lowest binary schema level that may still run against the schema
-- once it is applied. A binary's level is the highest migration it embeds.
-- An additive migration (a new table, a nullable column that old code
-- ignores) keeps the previous value: the old binaries keep running during a
-- rolling upgrade. A breaking one (a rule that old code would violate, a
-- column old code must fill) raises it to its own version: `migrate`
-- records the new value here before it applies the migration, refuses to
-- while a registered replica of a lower level still runs (unless
-- --allow-breaking), and every binary of a lower level stops billing.
-- db/migrations/compat.go reads the line; docs/operations.md (Upgrade)
-- says which rollout each kind needs.
--
-- This migration only adds tables: the binaries of level 3 (b522a65) bill
-- correctly beside it, though they check nothing (they refuse to start on
-- any newer schema, and a running one never looks again).
CREATE TABLE schema_compat (
    singleton     boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    lowest_binary bigint      NOT NULL CHECK (lowest_binary > 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO schema_compat (lowest_binary) VALUES (3);

-- billing_replica registers each running `billing-consumer run` with its
-- binary level, so that `migrate` knows which levels still run. A replica
-- inserts its row once its schema check passes, refreshes heartbeat_at
-- (the database's clock) while it bills, and deletes it when it stops or
-- stops billing; a SIGKILLed replica's row goes stale
-- (migrations.ReplicaStaleAfter) and is then ignored.
CREATE TABLE billing_replica (
    replica_id     text        PRIMARY KEY,
    binary_level   bigint      NOT NULL,
    version        text        NOT NULL,
    consumer_group text        NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    heartbeat_at   timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE billing_replica;
DROP TABLE schema_compat;
