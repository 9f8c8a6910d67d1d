-- +goose Up
-- lowest-compatible-binary: 7

-- consumer_position is how far the database holds the stream's decisions
-- (issue 30, item 1): per (consumer group, topic, partition), next_offset
-- is an offset below which every record's decision is in this database.
-- The committer of a binary of level 13 writes the positions of the
-- partitions it is about to commit, in one statement that only moves them
-- forward, before each Kafka offset commit (the interval's, a revoke's,
-- the shutdown's); if the write fails, that Kafka commit is not made.
-- Since a standby replays the WAL in order, a position that survives a
-- failover proves that every decision before it survived: where the
-- group's committed offset in Kafka is ahead of the position, the commits
-- in between were lost (docs/design.md, "Positions").
--
-- A partition has no row until its first commit by a level-13 binary:
-- absence means "not tracked yet", never a loss. written_at is the
-- database's clock at the last move.
--
-- Additive: binaries of level 12 and below neither read nor write these
-- tables (they commit offsets without moving a position, which is why a
-- position may lag Kafka while they run); the rollout is rolling and the
-- lowest compatible binary stays 7.
CREATE TABLE consumer_position (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL CHECK (partition >= 0),
    next_offset    bigint      NOT NULL CHECK (next_offset >= 0),
    written_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- position_audit records each operator's move of positions with
-- `billing-consumer positions accept` (after a deliberate forward reset of
-- the group's offsets): who, from which host, when (the database's clock),
-- why, and the position before (NULL: no row) and after. Inserted in the
-- transaction that moves the position, like claim_audit; kept forever.
CREATE TABLE position_audit (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      int         NOT NULL,
    operator       text        NOT NULL CHECK (operator <> ''),
    host           text        NOT NULL DEFAULT '',
    reason         text        NOT NULL CHECK (reason <> ''),
    at             timestamptz NOT NULL DEFAULT now(),
    before         bigint,
    after          bigint      NOT NULL
);
CREATE INDEX position_audit_partition ON position_audit (consumer_group, topic, partition, at);

-- +goose Down
DROP TABLE position_audit;
DROP TABLE consumer_position;
