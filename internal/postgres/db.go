package postgres

// DB, the adapter's handle on the database: what the rest of the program
// holds instead of a pgx pool (issue 32), and how it is opened.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/redact"
)

// DB is a pool of connections to the billing database. The program's
// other packages hold a *DB and pass it to this package's constructors
// (NewStore, NewSessions, Positions, Migrate, ...); only the adapter sees
// the pool inside. Safe for concurrent use; Close it once, after every
// user of it has stopped.
type DB struct {
	pool *pgxpool.Pool
}

// Option configures Open.
type Option func(*pgxpool.Config)

// WithMaxConns bounds the pool at n connections (BILLING_DB_MAX_CONNS);
// n <= 0 leaves pgx's default.
func WithMaxConns(n int32) Option {
	return func(pc *pgxpool.Config) {
		if n > 0 {
			pc.MaxConns = n
		}
	}
}

// WithHeal runs h's failover check on every new connection before it is
// used (HealOnConnect): run's pool has it, the one-shot commands' have
// not.
func WithHeal(h *heal.Healer, group, topic string) Option {
	return func(pc *pgxpool.Config) { pc.AfterConnect = HealOnConnect(h, group, topic) }
}

// ErrInvalidURL is Open's error for a connection string pgx cannot read.
// It never quotes the string, which may hold a password: ValidateURL
// says what is wrong with it.
var ErrInvalidURL = errors.New("not a valid connection string")

// Open makes the pool of the connection string url without connecting:
// run waits for the database itself while it serves /healthz. Its errors
// never include url (ErrInvalidURL for one pgx cannot read).
func Open(ctx context.Context, url string, opts ...Option) (*DB, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, ErrInvalidURL
	}
	for _, o := range opts {
		o(pc)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return &DB{pool: pool}, nil
}

// Connect is Open, then one Ping within 15 seconds, for the one-shot
// commands: they fail at once when the database is unreachable. The error
// names host, port and database, never the password.
func Connect(ctx context.Context, url string, opts ...Option) (*DB, error) {
	db, err := Open(ctx, url, opts...)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := db.Ping(pctx); err != nil {
		db.Close()
		cc := db.pool.Config().ConnConfig
		return nil, fmt.Errorf("connect to database %s:%d/%s: %w", cc.Host, cc.Port, cc.Database, err)
	}
	return db, nil
}

// FromPool is the DB of a pool its caller opened and closes (tests, and
// tools that already hold one). Closing the DB closes the pool.
func FromPool(pool *pgxpool.Pool) *DB { return &DB{pool: pool} }

// Ping acquires a connection and checks that the server answers.
func (db *DB) Ping(ctx context.Context) error { return db.pool.Ping(ctx) }

// Close closes every connection, waiting for those in use to be released.
func (db *DB) Close() { db.pool.Close() }

// ValidateURL checks a connection string as Open will read it. Its error
// is one line naming what is wrong (a parameter such as sslmode, the port,
// the syntax), never the string itself: it may hold a password.
func ValidateURL(url string) error {
	if _, err := pgxpool.ParseConfig(url); err != nil {
		return errors.New(connStringProblem(url, err))
	}
	return nil
}

// connStringProblem is what pgx says is wrong with the connection string
// conn, without the string itself: pgx's ParseConfigError quotes it
// (passwords masked on a best-effort basis only) before its message.
func connStringProblem(conn string, err error) string {
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			msg = msg[i+len("`: "):]
		} else {
			msg = ErrInvalidURL.Error()
		}
	}
	for _, pw := range redact.Passwords(conn) {
		if strings.Contains(msg, pw) {
			return ErrInvalidURL.Error()
		}
	}
	return msg
}

// UndefinedTable tells whether err is Postgres's undefined_table (42P01):
// the schema is behind the statement, and `billing-consumer migrate` is
// the cure.
func UndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
