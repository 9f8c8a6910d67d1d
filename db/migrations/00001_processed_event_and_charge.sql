-- +goose Up

-- processed_event records every event a consumer group has finished, so a
-- redelivery of the same event_id is skipped. It is partitioned by the
-- event_id itself: a UUIDv7 starts with its creation time in milliseconds,
-- so each UTC day is a contiguous range of UUIDs and every delivery of an
-- event lands in the same partition. Partitioning by processed_at instead
-- would force processed_at into the primary key and let a redelivery a
-- second later insert a second row: dedup would silently break.
-- Partitions are created ahead and dropped after the retention period by
-- internal/dedup (billing-consumer retention); there is deliberately no
-- DEFAULT partition, so an event outside every partition fails the insert
-- and is decided by the charge ledger alone.
CREATE TABLE processed_event (
    event_id       uuid        NOT NULL,
    consumer_group text        NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, consumer_group)
) PARTITION BY RANGE (event_id);

-- charge is the ledger: one row per order, kept forever. Its primary key
-- is what makes a second, different event for an already charged order
-- harmless, even after the first event's processed_event partition is gone.
CREATE TABLE charge (
    order_id           bigint        PRIMARY KEY CHECK (order_id > 0),
    event_id           uuid          NOT NULL UNIQUE,
    customer_id        bigint        NOT NULL CHECK (customer_id > 0),
    amount             numeric(12,2) NOT NULL CHECK (amount > 0),
    provider_charge_id text,
    charged_at         timestamptz   NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE charge;
DROP TABLE processed_event;
