-- +goose Up
-- lowest-compatible-binary: 5

-- others_sent_at is the durable trace that a request for the claim has
-- been sent by an attempt that did not create it (a redelivery of the
-- event, the completer, reconcile). Each of them sets it, in a statement
-- committed on its own, before its request leaves the process. The
-- creating attempt may release the claim on a definite refusal only while
-- it is NULL (and only with its own claim_token): once another attempt may
-- have sent the request, a refusal of the creator's own request proves
-- nothing about the money, and a released claim would let a distinct
-- event charge the order again (SPEC §6). NULL for every claim before this
-- migration: their senders held the claim FOR KEY SHARE instead, for the
-- length of their own transaction.
--
-- This changes the release rule: a binary built before it releases claims
-- without looking at the column, so it must not run beside one built
-- after (see docs/operations.md, "Upgrade"): it declares itself the
-- lowest compatible level, and binaries before 00004 do not check it, so this
-- step is stop-then-start.
ALTER TABLE charge ADD COLUMN others_sent_at timestamptz;

-- A parked claim (SPEC §10): its event kept failing transiently for
-- BILLING_PARK_AFTER while the provider charged other events, so its record
-- was committed and the completer owns the claim from parked_at on. It
-- re-sends the claim's request (same key, same body) whenever next_send_at
-- has passed, on a backoff of its own from seconds up, rather than after
-- BILLING_COMPLETER_AFTER. Both are the database's clock (now()), never a
-- replica's.
ALTER TABLE charge ADD COLUMN parked_at timestamptz;
ALTER TABLE charge ADD COLUMN next_send_at timestamptz;
CREATE INDEX charge_parked_due ON charge (next_send_at) WHERE status = 'pending' AND parked_at IS NOT NULL;

-- +goose Down
DROP INDEX charge_parked_due;
ALTER TABLE charge DROP COLUMN next_send_at;
ALTER TABLE charge DROP COLUMN parked_at;
ALTER TABLE charge DROP COLUMN others_sent_at;
