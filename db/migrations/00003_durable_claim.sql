-- +goose Up

-- The ledger row is the claim on an order (SPEC §6). It is committed in a
-- short statement of its own before any request reaches the provider, so
-- a transaction, connection or process that dies after the provider took
-- the money can never let another event charge the order again.
--
--   pending  claimed by event_id; the charge's outcome is not known yet.
--            Only that event (same Idempotency-Key, same body, rebuilt from
--            this row) may settle it: its redelivery, the service's
--            completer, or `billing-consumer reconcile`.
--   charged  the provider took the charge; provider_charge_id holds its id.
--   blocked  the provider answered 422, refused a request that did not
--            create the claim, or the outcome stayed unknown past
--            BILLING_CLAIM_BLOCK_AFTER: an operator decides. Never released
--            automatically.
--
-- A claim is deleted only when the attempt that created it got a definite
-- refusal (400, 402, 404) and none of its requests had an unknown outcome:
-- then no money moved.
ALTER TABLE charge DROP CONSTRAINT charge_status_check;
ALTER TABLE charge ADD CONSTRAINT charge_status_check
    CHECK (status IN ('pending', 'charged', 'blocked'));

-- claimed_at is when the claim was committed; the completer settles the
-- pending claims older than BILLING_COMPLETER_AFTER. settle_attempts and
-- last_error say what the completer tried, for the operator of a blocked
-- claim.
ALTER TABLE charge ADD COLUMN claimed_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE charge ADD COLUMN settle_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE charge ADD COLUMN last_error text;
-- claim_token identifies the attempt that created the claim: one
-- delivery's processing, its retries included (internal/billing
-- WithAttempt). A redelivery, the completer or reconcile is another
-- attempt, so a refusal it gets cannot release the claim.
ALTER TABLE charge ADD COLUMN claim_token uuid;

-- The completer and the ledger gauges read only the unsettled rows.
CREATE INDEX charge_unsettled ON charge (claimed_at) WHERE status <> 'charged';

-- +goose Down
DROP INDEX charge_unsettled;
ALTER TABLE charge DROP COLUMN claim_token;
ALTER TABLE charge DROP COLUMN last_error;
ALTER TABLE charge DROP COLUMN settle_attempts;
ALTER TABLE charge DROP COLUMN claimed_at;
ALTER TABLE charge DROP CONSTRAINT charge_status_check;
ALTER TABLE charge ADD CONSTRAINT charge_status_check CHECK (status IN ('pending', 'charged'));
