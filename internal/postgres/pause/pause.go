// Package pause is an operator's pause of billing for every replica of a
// consumer group, kept in Postgres (the billing_pause table, migration
// 00007): `billing-consumer pause` writes the group's row, `resume`
// deletes it, and each replica's Watcher reads it every few seconds and
// opens or closes its Gate. The consumer waits on the Gate before it
// fetches or hands out a record, and every sender checks the pause before
// each request (SPEC §11 I4: the pipeline and its retries, the deferred
// decisions, the completer, the billing service where its requests leave;
// reconcile reads the row itself), so a paused replica stays in the group
// (no rebalance, no autoscaler undoing it), finishes the requests in
// flight, keeps committing what finishes, and sends nothing new.
package pause

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// State is the pause of one consumer group.
type State struct {
	Paused                 bool
	Reason, Operator, Host string
	Since                  time.Time
	// For is how long it has been in force, by the database's clock.
	For time.Duration
}

// Querier is what Get needs: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// stateColumns ends with the pause's age in milliseconds, by the
// database's clock.
const stateColumns = `reason, operator, host, since, greatest((extract(epoch FROM now() - since) * 1000)::bigint, 0)`

func scanState(row pgx.Row) (State, error) {
	s := State{Paused: true}
	var ms int64
	if err := row.Scan(&s.Reason, &s.Operator, &s.Host, &s.Since, &ms); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return State{}, nil
		}
		return State{}, err
	}
	s.For = time.Duration(ms) * time.Millisecond
	return s, nil
}

// Get reads the pause of group; the zero State when it is not paused.
func Get(ctx context.Context, q Querier, group string) (State, error) {
	s, err := scanState(q.QueryRow(ctx, `SELECT `+stateColumns+` FROM billing_pause WHERE consumer_group = $1`, group))
	if err != nil {
		return State{}, fmt.Errorf("read pause of group %s: %w", group, err)
	}
	return s, nil
}

// Set pauses group. Pausing a paused group keeps its first since and
// replaces the reason and operator (the latest word); the returned State
// is the pause now in force.
func Set(ctx context.Context, pool *pgxpool.Pool, group, reason, operator, host string) (State, error) {
	s, err := scanState(pool.QueryRow(ctx, `INSERT INTO billing_pause (consumer_group, reason, operator, host) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer_group) DO UPDATE SET reason = excluded.reason, operator = excluded.operator, host = excluded.host
RETURNING `+stateColumns, group, reason, operator, host))
	if err != nil {
		return State{}, fmt.Errorf("pause group %s: %w", group, err)
	}
	return s, nil
}

// Clear ends the pause of group and returns the pause it ended (the zero
// State when the group was not paused).
func Clear(ctx context.Context, pool *pgxpool.Pool, group string) (State, error) {
	s, err := scanState(pool.QueryRow(ctx, `DELETE FROM billing_pause WHERE consumer_group = $1 RETURNING `+stateColumns, group))
	if err != nil {
		return State{}, fmt.Errorf("resume group %s: %w", group, err)
	}
	return s, nil
}

// Watcher follows the pause of one group for one replica. Its Gate is
// closed (paused) until the first Refresh succeeds: a replica that cannot
// tell whether billing is paused does not start. After that, a failed read
// keeps the last known state. Safe for concurrent use.
type Watcher struct {
	Pool   *pgxpool.Pool
	Group  string
	Logger *slog.Logger
	// OnState, when set, is called after each successful read.
	OnState func(State)

	mu    sync.Mutex
	known bool
	state State
	open  chan struct{} // closed while not paused
}

func (w *Watcher) init() {
	if w.open == nil {
		w.open = make(chan struct{})
	}
}

// Gate returns a channel that is closed while billing is not paused; the
// channel of a pause stays open until it ends. Callers wait on it and
// call Gate again after it fires.
func (w *Watcher) Gate() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.init()
	return w.open
}

// State returns the last pause read, and false before the first read.
func (w *Watcher) State() (State, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state, w.known
}

// Refresh reads the pause once and opens or closes the Gate; a change is
// logged.
func (w *Watcher) Refresh(ctx context.Context) error {
	s, err := Get(ctx, w.Pool, w.Group)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.init()
	wasKnown := w.known
	changed := !w.known || s.Paused != w.state.Paused
	w.known, w.state = true, s
	switch {
	case !s.Paused && changed:
		close(w.open)
	case s.Paused && changed && isClosed(w.open):
		w.open = make(chan struct{})
	}
	w.mu.Unlock()
	switch {
	case changed && s.Paused:
		w.Logger.Warn("billing paused by an operator: fetching and sending stopped, requests in flight finish", "group", w.Group,
			"reason", s.Reason, "operator", s.Operator, "since", s.Since.UTC().Format(time.RFC3339))
	case changed && wasKnown:
		w.Logger.Info("billing resumed: fetching again", "group", w.Group)
	}
	if w.OnState != nil {
		w.OnState(s)
	}
	return nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
