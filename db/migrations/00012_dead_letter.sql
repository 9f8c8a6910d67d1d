-- +goose Up
-- lowest-compatible-binary: 7

-- SPEC §11 I2: a valid event is decided once, and its dead letters all
-- carry one reason. A binary of level 12 records here, before it writes a
-- valid event's dead letter, the decision it dead-letters (reason and
-- error), with the dlq-replay-count of the record it decided (0 for a
-- record never replayed). A later delivery of a record whose count is not
-- higher (a lost offset commit, a rebalance, an offset reset), with the
-- same parameters (order, customer, amount), is answered
-- by the row: the same dead letter is written again, with the stored
-- reason, and nothing is claimed or sent. Only a `dlq replay` (a record
-- with a higher count) decides the event afresh; if that decision is a
-- dead letter too, the row takes its reason and count. A row never
-- answers for an event whose own claim is charged: the money decides.
--
-- Additive: binaries of level 11 and below neither read nor write this
-- table. Beside them a redelivered dead-lettered record is decided afresh
-- by whichever replica gets it, as before (its dead letters may then carry
-- two reasons); the rollout is rolling and the lowest compatible binary
-- stays 7. Rows older than BILLING_DEDUP_RETENTION are deleted by the
-- retention pass (a small table: a dead letter is rare).
CREATE TABLE dead_letter (
    event_id       uuid        NOT NULL,
    consumer_group text        NOT NULL,
    -- The parameters of the record decided: a decision answers only a
    -- record of the same event_id with the same order, customer and
    -- amount. A record that reuses an event_id with other parameters (a
    -- true conflict) has a decision of its own and never answers the
    -- valid event's records, nor they it.
    order_id       bigint      NOT NULL,
    customer_id    bigint      NOT NULL,
    amount         numeric     NOT NULL,
    -- reason is the dlq-reason of the event's dead letters: permanent,
    -- conflict or exhausted (invalid records have no event and no row).
    reason         text        NOT NULL,
    -- replay_count is the dlq-replay-count of the record decided.
    replay_count   int         NOT NULL,
    error          text        NOT NULL,
    decided_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, consumer_group, order_id, customer_id, amount)
);
CREATE INDEX dead_letter_decided_at ON dead_letter (decided_at);

-- +goose Down
DROP TABLE dead_letter;
