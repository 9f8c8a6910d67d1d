-- +goose Up

-- A ledger row is 'pending' while the outcome of its charge is unknown: the
-- provider may have taken the money (a timeout, a reset, a 5xx) but the
-- answer never arrived. The row is committed anyway, without the event's
-- processed_event row, so that the order stays claimed by this event: no
-- other event for the order may charge it until this event's retry (same
-- Idempotency-Key) settles the outcome and marks the row 'charged', or
-- learns that nothing was taken and removes it. Rows committed in one go
-- are 'charged' at once.
ALTER TABLE charge ADD COLUMN status text NOT NULL DEFAULT 'charged'
    CHECK (status IN ('pending', 'charged'));

-- +goose Down
ALTER TABLE charge DROP COLUMN status;
