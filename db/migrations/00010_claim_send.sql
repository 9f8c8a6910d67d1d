-- +goose Up
-- lowest-compatible-binary: 7

-- SPEC §11 I5: no operator decision races a request in flight. Every send
-- of a claim's request is recorded, committed, before the request leaves
-- the process, with the sender's whole deadline D (the sender never sends
-- after it): in_flight_until = now() + D. decide_after adds the provider's
-- bound (BILLING_PROVIDER_MAX_PROCESSING: how long the provider may still
-- finish a request the client gave up on), so that `claim release` and
-- `claim mark-charged`, which refuse until decide_after, read every bound
-- from the database and none from their own environment. Both only grow
-- (greatest), both are the database's clock.
--
-- The creator's first send is recorded by the claim insert itself (the
-- hot path pays no extra statement; claimed_by is its replica); every
-- other send — the creator's retries, a redelivery, the completer,
-- reconcile — updates the two columns and adds a claim_send row in one
-- statement committed before its request. A claim_send row outlives its
-- claim (a released claim's sends stay visible to `claim show`).
--
-- Binaries of level 9 and below never write these columns: their sends
-- leave no trace. They read no column added here, so they bill correctly
-- beside this schema and the upgrade is rolling (the lowest compatible
-- binary stays 7, as 00008 left it); instead, `claim release` and `claim
-- mark-charged` refuse while a replica of a level below 10 heartbeats in
-- billing_replica (docs/operations.md, BillingLedgerClaimBlocked). NULL
-- for every claim made before this migration.
ALTER TABLE charge ADD COLUMN in_flight_until timestamptz;
ALTER TABLE charge ADD COLUMN decide_after timestamptz;
ALTER TABLE charge ADD COLUMN claimed_by text;

CREATE TABLE claim_send (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id        bigint      NOT NULL,
    event_id        uuid        NOT NULL,
    -- sender is who sent: creator (a retry of the attempt that made the
    -- claim), redelivery (another attempt of the claim's event),
    -- completer or reconcile; host is its replica or pod.
    sender          text        NOT NULL,
    host            text        NOT NULL,
    sent_at         timestamptz NOT NULL DEFAULT now(),
    in_flight_until timestamptz NOT NULL
);
CREATE INDEX claim_send_order ON claim_send (order_id, id);

-- +goose Down
DROP TABLE claim_send;
ALTER TABLE charge DROP COLUMN claimed_by;
ALTER TABLE charge DROP COLUMN decide_after;
ALTER TABLE charge DROP COLUMN in_flight_until;
