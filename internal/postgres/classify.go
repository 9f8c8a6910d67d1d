package postgres

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// classifyDB gives a Postgres error its kind. Losing the database is
// Systemic: the consumer pauses rather than dead-lettering healthy events.
// Serialization failures, deadlocks and lock or statement timeouts are
// Transient. Anything else is Transient too: retrying is safe (the
// transaction rolled back) and a retry limit ends it in the DLQ.
func classifyDB(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutdown, crash, starting up
			pgErr.Code == "53300", // too many connections
			pgErr.Code == "25006": // read-only transaction: a failover in progress
			return fault.New(fault.Systemic, err)
		}
		return fault.New(fault.Transient, err)
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) {
		return fault.New(fault.Systemic, err)
	}
	return fault.New(fault.Transient, err)
}
