-- +goose Up
-- lowest-compatible-binary: 7

-- heal_range is the failover heal's gate (issue 30, item 2;
-- docs/design.md, "The heal"). A replica that finds, on a new database
-- connection, a partition whose committed offset in Kafka carries the
-- consumer's mark but is ahead of consumer_position (the standby lost
-- the last commits) inserts one row per partition of the topic that a
-- marked commit covers: lo, the first offset whose decision the database
-- may have lost (the surviving position, or the committed offset), and
-- hi, the target: no decision at or past it can have been taken before
-- the loss (the last commit's frontier, or the log end). While any row
-- of a group has lifted_at NULL, every replica of the group (level 14 and
-- later) re-decides the records in [lo, hi) and holds every other record
-- and its billing loops; the replica that sees every position reach its
-- row's hi sets lifted_at. committed and position are what was found
-- (position NULL: no row). Rows are kept after the lift: the history of
-- heals. Orders whose events the lost records cannot tell apart get a
-- 'blocked' claim (status in charge) in the same transaction.
--
-- Additive: binaries of level 13 and below neither read nor write it (and
-- write no marks, so their commits are never healed); the lowest
-- compatible binary stays 7.
CREATE TABLE heal_range (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL CHECK (partition >= 0),
    lo             bigint      NOT NULL CHECK (lo >= 0),
    hi             bigint      NOT NULL,
    committed      bigint      NOT NULL,
    position       bigint,
    started_at     timestamptz NOT NULL DEFAULT now(),
    started_by     text        NOT NULL,
    blocked_orders int         NOT NULL DEFAULT 0,
    lifted_at      timestamptz,
    CHECK (hi >= lo)
);
CREATE UNIQUE INDEX heal_range_up ON heal_range (consumer_group, topic, partition) WHERE lifted_at IS NULL;

-- +goose Down
DROP TABLE heal_range;
