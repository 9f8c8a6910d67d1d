-- +goose Up
-- lowest-compatible-binary: 7

-- SPEC §11, the 2xx rule: a 2xx for a claim that was released, deleted or
-- taken by another event while its request was in flight (a foreign
-- binary, a manual DELETE, a provider that finished a request past its
-- bound) is the truth about the money and is never dropped. A binary of
-- level 11 records each such answer here, in the transaction that
-- records the rest of its charges, and moves the order's ledger row as
-- the rule says: no row, a claim of the event's own inserted as charged;
-- another event's pending claim blocked for an operator (its last_error
-- names the stray charge); another event's charged or blocked claim left
-- as it is (two charges: logged at ERROR, and the operator sees both in
-- `claim show`). The event's outcome is `charged`: its key was.
--
-- Additive: binaries of level 10 and below neither read nor write this
-- table, and the rows a level-11 binary writes into charge are ordinary
-- charged and blocked claims that they read as before. Beside them such a
-- 2xx is still answered by the older binaries as they did (a `conflict`
-- dead letter, the claim left as it was); the rollout is rolling and the
-- lowest compatible binary stays 7.
CREATE TABLE stray_charge (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id           bigint      NOT NULL,
    -- event_id is the event whose key the provider charged (its
    -- idempotency key), provider_charge_id the provider's id for it ('' if
    -- the answer carried none).
    event_id           uuid        NOT NULL,
    provider_charge_id text        NOT NULL,
    -- at is the database's clock; sender who got the 2xx (creator,
    -- redelivery, completer, reconcile).
    at                 timestamptz NOT NULL DEFAULT now(),
    sender             text        NOT NULL,
    -- claim_event_id and claim_status are the order's ledger row as the
    -- 2xx found it (NULL: none, and the event's own claim was inserted as
    -- charged).
    claim_event_id     uuid,
    claim_status       text
);
CREATE INDEX stray_charge_order ON stray_charge (order_id, id);

-- +goose Down
DROP TABLE stray_charge;
