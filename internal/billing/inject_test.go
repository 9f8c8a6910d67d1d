package billing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// The fault injector stands between billing and its two collaborators, the
// database and the provider, and numbers every operation billing makes
// (each statement, BEGIN, COMMIT, each charge request) in the order it
// makes them. A clean run gives the protocol's steps; a faulty run fails
// exactly one of them, either before it takes effect or after (its effect
// done, its answer lost), and either as a lost connection (billing goes on
// and sees an error) or as a crash (from then on nothing billing does
// reaches anything: the process is gone).

// faultMode is how the chosen operation fails.
type faultMode int

const (
	connLost faultMode = iota // the connection dies; the process lives on
	crash                     // the process dies there
)

func (m faultMode) String() string { return [...]string{"connection lost", "crash"}[m] }

var errInjected = errors.New("injected: connection lost")

// injector numbers operations and fails the chosen one. Safe for
// concurrent use.
type injector struct {
	mu      sync.Mutex
	ops     []string // the operations seen, in order
	failAt  int      // index of the operation to fail; -1: none
	after   bool     // fail it after it took effect
	mode    faultMode
	crashed bool
	// gate, when set, is called before operation k runs (outside the lock).
	gate func(k int, name string)
}

func newInjector() *injector { return &injector{failAt: -1} }

// before registers operation name and says whether it fails before it
// runs, and whether it then also fails after.
func (in *injector) begin(name string) (k int, failBefore, failAfter bool) {
	in.mu.Lock()
	k = len(in.ops)
	in.ops = append(in.ops, name)
	gate := in.gate
	in.mu.Unlock()
	if gate != nil {
		gate(k, name)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.crashed {
		return k, true, false
	}
	if k == in.failAt {
		if in.mode == crash {
			if in.after {
				in.crashed = true // after this operation's effect, nothing more
				return k, false, true
			}
			in.crashed = true
			return k, true, false
		}
		return k, !in.after, in.after
	}
	return k, false, false
}

// dead reports whether the process has crashed.
func (in *injector) dead() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.crashed
}

func (in *injector) trace() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.ops...)
}

// opName names a statement by its first words.
func opName(sql string) string {
	f := strings.Fields(sql)
	switch {
	case strings.Contains(sql, "INSERT INTO deferred_event"):
		return "defer"
	case strings.HasPrefix(sql, "UPDATE deferred_event"):
		return "take or retry deferred"
	case strings.HasPrefix(sql, "DELETE FROM deferred_event"):
		return "finish deferred"
	case len(f) >= 3 && f[0] == "INSERT" && f[2] == "charge", strings.HasPrefix(sql, "WITH v AS"):
		return "claim"
	case len(f) >= 3 && f[0] == "INSERT" && f[2] == "processed_event":
		return "dedup insert"
	case len(f) >= 2 && f[0] == "UPDATE" && strings.Contains(sql, "'charged'"):
		return "record"
	case len(f) >= 1 && (f[0] == "UPDATE" || strings.HasPrefix(sql, "WITH sent AS")) && strings.Contains(sql, "others_sent_at"):
		return "mark sent"
	case len(f) >= 1 && f[0] == "SELECT" && strings.Contains(sql, "FOR KEY SHARE"):
		return "claim hold"
	case len(f) >= 1 && f[0] == "SELECT":
		return "ledger lookup"
	case len(f) >= 1:
		return strings.ToLower(f[0]) + " " + strings.ToLower(f[min(2, len(f)-1)])
	}
	return sql
}

// faultDB is a postgres.Conn whose operations go through an injector.
type faultDB struct {
	db postgres.Conn
	in *injector
}

func (f faultDB) Begin(ctx context.Context) (pgx.Tx, error) {
	_, before, after := f.in.begin("begin")
	if before {
		return nil, errInjected
	}
	tx, err := f.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if after {
		killConn(tx)
		_ = tx.Rollback(ctx) // fails on the dead connection, and gives it back to the pool
		return nil, errInjected
	}
	return faultTx{Tx: tx, in: f.in, committed: new(bool)}, nil
}

func (f faultDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	_, before, after := f.in.begin(opName(sql))
	if before {
		return pgconn.CommandTag{}, errInjected
	}
	tag, err := f.db.Exec(ctx, sql, args...)
	if after && err == nil {
		return pgconn.CommandTag{}, errInjected
	}
	return tag, err
}

func (f faultDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	_, before, after := f.in.begin(opName(sql))
	if before {
		return nil, errInjected
	}
	rows, err := f.db.Query(ctx, sql, args...)
	if after && err == nil {
		rows.Close() // the statement ran to its end; its answer is lost
		return nil, errInjected
	}
	return rows, err
}

// faultTx is a pgx.Tx whose statements and commit go through an injector.
// A failure before or after a statement inside the transaction kills the
// transaction's connection, as a real cut does: the server rolls back.
type faultTx struct {
	pgx.Tx
	in        *injector
	committed *bool // the connection is back in the pool: never kill it
}

// killConn closes the transaction's network connection without a word to
// the server.
func killConn(tx pgx.Tx) { _ = tx.Conn().PgConn().Conn().Close() }

func (t faultTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	_, before, after := t.in.begin(opName(sql))
	if before {
		killConn(t.Tx)
		return pgconn.CommandTag{}, errInjected
	}
	tag, err := t.Tx.Exec(ctx, sql, args...)
	if after {
		killConn(t.Tx)
		return pgconn.CommandTag{}, errInjected
	}
	return tag, err
}

func (t faultTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	_, before, after := t.in.begin(opName(sql))
	if before {
		killConn(t.Tx)
		return nil, errInjected
	}
	rows, err := t.Tx.Query(ctx, sql, args...)
	if after && err == nil {
		for rows.Next() {
		}
		rows.Close()
		killConn(t.Tx)
		return nil, errInjected
	}
	return rows, err
}

func (t faultTx) Commit(ctx context.Context) error {
	_, before, after := t.in.begin("commit")
	if before {
		killConn(t.Tx)
		_ = t.Tx.Commit(ctx) // fails on the dead connection, and gives it back to the pool
		return errInjected
	}
	err := t.Tx.Commit(ctx)
	*t.committed = err == nil
	if after && err == nil {
		return errInjected // committed; the answer lost
	}
	return err
}

func (t faultTx) Rollback(ctx context.Context) error {
	if t.in.dead() && !*t.committed {
		// A dead process rolls back by losing its connection. (The pgx
		// rollback then fails, and hands the connection back to the pool
		// to be discarded.)
		killConn(t.Tx)
		_ = t.Tx.Rollback(ctx)
		return errInjected
	}
	return t.Tx.Rollback(ctx)
}

// faultCharger is a Charger whose requests go through an injector: failed
// before, the request never reaches the provider; failed after, the
// provider processed it and the answer is lost.
type faultCharger struct {
	c  billing.Charger
	in *injector
}

func (f faultCharger) Charge(ctx context.Context, ch billing.ChargeRequest) (billing.ChargeResult, error) {
	if isCompanion(ch.IdempotencyKey) {
		// Not a step of the protocol under test; but a dead process sends
		// nothing.
		if f.in.dead() {
			return billing.ChargeResult{}, fault.Errorf(fault.Transient, "injected: the process is dead")
		}
		return f.c.Charge(ctx, ch)
	}
	_, before, after := f.in.begin("charge")
	if before {
		return billing.ChargeResult{}, fault.Errorf(fault.Transient, "injected: request not sent")
	}
	r, err := f.c.Charge(ctx, ch)
	if after {
		return billing.ChargeResult{}, fault.Errorf(fault.Transient, "injected: answer lost (provider said %v)", errOr(err, "2xx"))
	}
	return r, err
}

func errOr(err error, ok string) string {
	if err == nil {
		return ok
	}
	return fmt.Sprint(err)
}
