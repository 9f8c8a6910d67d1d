-- +goose Up
-- lowest-compatible-binary: 5

-- claim_audit records every decision an operator made on a ledger claim
-- with `billing-consumer claim release|mark-charged` (internal/billing
-- operator.go): who (the --operator flag, else the OS user), from which
-- host (the pod), when (the database's clock), why (--reason, required),
-- and the charge row before and after (after is NULL for a release, which
-- deletes the claim). The row is inserted in the same transaction as the
-- change, so no change goes unrecorded. Kept forever, like the ledger.
CREATE TABLE claim_audit (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id  bigint      NOT NULL,
    action    text        NOT NULL CHECK (action IN ('release', 'mark-charged')),
    operator  text        NOT NULL CHECK (operator <> ''),
    host      text        NOT NULL DEFAULT '',
    reason    text        NOT NULL CHECK (reason <> ''),
    at        timestamptz NOT NULL DEFAULT now(),
    before    jsonb       NOT NULL,
    after     jsonb
);
CREATE INDEX claim_audit_order ON claim_audit (order_id, at);

-- +goose Down
DROP TABLE claim_audit;
