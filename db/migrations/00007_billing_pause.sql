-- +goose Up
-- lowest-compatible-binary: 7

-- billing_pause holds an operator's pause of a consumer group
-- (`billing-consumer pause --reason TEXT`, ended by `resume`): while the
-- group's row exists every replica of that group stays in the group but
-- fetches nothing new, finishing what it has in flight (internal/pause).
-- Kept here, not in a replica, so it reaches every replica within seconds,
-- survives restarts and rollouts, and cannot be undone by an autoscaler.
-- since is the database's clock, so every replica reports the same age.
CREATE TABLE billing_pause (
    consumer_group text        PRIMARY KEY,
    reason         text        NOT NULL CHECK (reason <> ''),
    operator       text        NOT NULL CHECK (operator <> ''),
    host           text        NOT NULL DEFAULT '',
    since          timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE billing_pause;
