-- +goose Up
-- lowest-compatible-binary: 7

-- header_key_bytes holds a deferred record's header keys as the bytes the
-- record carried. Kafka header keys are strings on the wire, but kafka-go
-- hands them over as Go strings of any bytes, and header_keys (text[],
-- 00008) cannot hold a key that is not UTF-8 or holds a NUL byte: Postgres
-- refused the whole row (SQLSTATE 22021), the deferral failed, and the
-- event held its partition until the claim it waits on settled. A dead
-- letter written from the row must carry the original key bytes exactly.
--
-- A binary of level 9 writes header_key_bytes on every row, and
-- header_keys as well when every key is text Postgres can hold, else an
-- empty header_keys (the CHECK below allows exactly that); it reads
-- header_key_bytes, or header_keys on a row without it (written by level
-- 8 or before this migration).
--
-- No binary level is refused by this step, so the rollout is rolling:
-- - Level 7 neither reads nor writes deferred_event (00008).
-- - Level 8 writes rows without header_key_bytes (NULL), held to 00008's
--   rule, and level 9 reads them by header_keys. It reads header_keys and
--   header_values only, so it decides every row whose keys are text as
--   before. A row with a key that is not text has an empty header_keys
--   beside its values: level 8's scanDeferred refuses it (keys and values
--   differ in number) after leasing it, and the row stays, intact, until
--   its lease ends and a binary of level 9 takes it up. Level 8 cannot
--   mis-decide it, nor lose it, nor write such a row itself (its deferral
--   of such a record fails as it did before).
-- A rollback to level 8 must first let the rows with keys that are not
-- text be decided (docs/operations.md, Parked claims and deferred events).
ALTER TABLE deferred_event ADD COLUMN header_key_bytes bytea[];
ALTER TABLE deferred_event DROP CONSTRAINT deferred_event_check;
ALTER TABLE deferred_event ADD CONSTRAINT deferred_event_headers CHECK (CASE
    WHEN header_key_bytes IS NULL THEN cardinality(header_keys) = cardinality(header_values)
    ELSE cardinality(header_key_bytes) = cardinality(header_values)
        AND cardinality(header_keys) IN (0, cardinality(header_values))
END);

-- +goose Down
-- Restoring 00008's CHECK fails, and with it the whole step, while a row
-- with keys that are not text is left: dropping header_key_bytes would
-- lose its keys.
ALTER TABLE deferred_event DROP CONSTRAINT deferred_event_headers;
ALTER TABLE deferred_event ADD CONSTRAINT deferred_event_check CHECK (cardinality(header_keys) = cardinality(header_values));
ALTER TABLE deferred_event DROP COLUMN header_key_bytes;
