-- +goose Up
-- lowest-compatible-binary: 7

-- deferred_event holds the events whose decision waits on another event's
-- unsettled claim on their order (SPEC §10, "decided durably"). An event
-- that has waited BILLING_PARK_AFTER on such a claim is written here, with
-- its record exactly as consumed, and its record is committed; the
-- deciding loop (internal/pipeline, deferred.go) decides it once the
-- claim it waits on is settled (charged, or released; a blocked claim
-- waits for an operator's decision) and no event deferred before it on
-- the order is left — duplicate_order, a dead-letter
-- record "conflict" (written from these bytes: the original key, value and
-- headers), or its own charge if that claim was released — and deletes
-- the row after the decision is durable. A row lives until it is decided:
-- there is no TTL, since dropping a row would lose an event. Every claim
-- settles, or is blocked by BILLING_CLAIM_BLOCK_AFTER and then decided by
-- an operator (claim mark-charged or claim release), so rows do not
-- accumulate unseen: a row behind a blocked claim is the blocked claim's
-- alert.
--
-- Binaries of level 7 run safely beside this table: they neither write nor
-- read it, and redeliveries of a deferred record go through the ledger as
-- before (they do not see a deferred event's hold on its order, so beside
-- them a later event of the order may be decided first, as it could be
-- before this table). A rolling upgrade is fine; a rollback below level 8
-- must first let the table empty (docs/operations.md).
CREATE TABLE deferred_event (
    -- seq orders the deferrals: the events deferred on one order are
    -- decided in the order they were deferred, and a deferred event holds
    -- its order against every event not deferred before it (the claim
    -- statement skips such an order, and the event waits): a later record
    -- of the same key cannot overtake it.
    seq            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group text        NOT NULL,
    event_id       uuid        NOT NULL,
    order_id       bigint      NOT NULL,
    -- waits_for is the event whose claim (or deferral) held the order when
    -- the event was deferred (for an operator; the decision reads the
    -- ledger afresh).
    waits_for      uuid        NOT NULL,
    topic          text        NOT NULL,
    kafka_partition integer    NOT NULL,
    kafka_offset   bigint      NOT NULL,
    record_key     bytea,
    record_value   bytea       NOT NULL,
    header_keys    text[]      NOT NULL DEFAULT '{}',
    header_values  bytea[]     NOT NULL DEFAULT '{}',
    record_time    timestamptz,
    -- The times are the database's clock (SPEC §10).
    deferred_at    timestamptz NOT NULL DEFAULT now(),
    -- next_try_at is when the row may next be taken up: a deciding replica
    -- leases a row by moving it forward (attempts counts the leases, and
    -- only the holder of the latest may finish the row), and a decision
    -- whose own charge stayed unknown backs off through it.
    next_try_at    timestamptz NOT NULL DEFAULT now(),
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text,
    -- One row per record: a redelivery of a deferred record finds its row
    -- (the event id too: a recreated topic reuses positions).
    UNIQUE (consumer_group, topic, kafka_partition, kafka_offset, event_id),
    CHECK (cardinality(header_keys) = cardinality(header_values))
);
CREATE INDEX deferred_event_due ON deferred_event (consumer_group, next_try_at);
-- The hold (claim statement) and the take look rows up by group and order.
CREATE INDEX deferred_event_order ON deferred_event (consumer_group, order_id, seq);

-- +goose Down
DROP TABLE deferred_event;
