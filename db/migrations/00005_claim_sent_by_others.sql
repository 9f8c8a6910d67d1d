-- +goose Up

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
-- after (see docs/operations.md, "Upgrades").
ALTER TABLE charge ADD COLUMN others_sent_at timestamptz;

-- +goose Down
ALTER TABLE charge DROP COLUMN others_sent_at;
