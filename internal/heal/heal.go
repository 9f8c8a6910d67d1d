// Package heal re-decides the records whose decisions a database failover
// lost (issue 30; SPEC §9; docs/design.md, "The heal").
//
// A failover onto an asynchronous standby loses the last commits the old
// primary acknowledged, while Kafka keeps the offsets committed after
// them: nothing would redeliver those records, and a later event of one of
// their orders would charge again. The consumer writes the database's
// position of a partition before every offset commit and marks the commit
// (kafkagroup.Mark), so a marked commit ahead of the position proves a
// loss. The Healer looks for one on every new database connection, before
// the connection is used (pgx's AfterConnect, wired by internal/postgres):
// after a failover every connection is new.
//
// When it finds one it installs the gate (the heal_range rows), in one
// transaction that also blocks, for an operator, every order with two or
// more distinct events in the ranges and no surviving claim (Suspect).
// While the gate is up, on every replica: the consumer starts each
// partition from its range's Lo (Start), re-decides the records below
// its Hi, holds every record at or past it (Hold), and the loops that
// bill skip their passes (Guard); the records re-decided charge under
// their own Idempotency-Key, so the provider answers from its stored
// result. The gate lifts (Watch) once every partition's position has
// reached its Hi. OnUp ends the in-flight work of the moment the gate
// goes up on a replica (the consumer's handlers, a billing loop's pass),
// before the connection that saw it is handed over.
//
// What a loss also erases and the heal does not restore — the operator's
// audit rows, the pause row, a settlement the completer had recorded
// (re-sent, same key) — is in docs/operations.md, "After a failover".
package heal

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// Store is the heal's storage (internal/postgres.HealStore). Every
// method works for the group and topic it was made for.
type Store interface {
	// Gate returns the ranges of the heal that is up, nil when none is.
	Gate(ctx context.Context) (map[int]Range, error)
	// Positions returns the positions by partition (absent: no row).
	Positions(ctx context.Context) (map[int]int64, error)
	// Install, in one transaction under the heal's lock, returns the
	// gate that is up if one is (mine false), else inserts ranges, blocks
	// each suspect's order unless its claim is charged (a new blocked
	// claim, or its pending one blocked), and returns ranges, how many it
	// blocked and mine true. In the same transaction it moves every
	// unsettled claim's in-flight window to at least w from now (see
	// Window).
	Install(ctx context.Context, ranges map[int]Range, suspects []Suspect, by string, w Window) (gate map[int]Range, blocked int, mine bool, err error)
	// Lift lifts the gate if every range's position has reached its Hi
	// and reports whether the gate is down now.
	Lift(ctx context.Context) (bool, error)
}

// Window is how long a request sent before the loss may still take
// money: the senders' whole deadline (Deadline) plus the provider's bound
// (ProviderBound, BILLING_PROVIDER_MAX_PROCESSING). A loss may have erased
// the in-flight windows recorded with the last sends (SPEC §11 I5), and
// the heal's blocked claims have none: so on a loss every unsettled
// claim's in_flight_until becomes at least now + Deadline and its
// decide_after now + Deadline + ProviderBound, and the operator's release
// and mark-charged wait for them (found by the lifecycle model's failover
// step: a release right after the heal, while a request sent before the
// failover was still at the provider, let another event charge too).
type Window struct{ Deadline, ProviderBound time.Duration }

// Config configures a Healer. Every field but OnUp and OnHeal is required.
type Config struct {
	Group, Topic string
	// Client reads the group's committed offsets and the log bounds.
	Client *kafka.Client
	// Reader re-reads the ranges (Brokers, Topic, Dialer, MaxBytes).
	Reader kafkagroup.ReaderConfig
	// Replica names this replica in heal_range.started_by.
	Replica string
	// Window is the in-flight window a loss gives every unsettled claim.
	Window Window
	Logger *slog.Logger
	// OnUp is called each time the gate goes up on this replica, before
	// the connection that saw it is used: it must end, synchronously,
	// every piece of work that could decide a record past a Hi (the
	// consumer's Abandon). The Healer itself cancels its Guard passes.
	OnUp func()
	// OnNewServer is called when a new connection finds the database is
	// another server than the one this replica's connections reached so
	// far (a failover, a restore, a restart), before that connection is
	// used: it must forget, synchronously, every decision the replica
	// holds as made but not committed yet (the consumer's Drop): those
	// decisions were taken on the old server, which may have lost them.
	OnNewServer func()
	// OnHeal counts a heal this replica installed: records rewound below
	// the committed offsets, orders blocked.
	OnHeal func(rewound int64, blocked int)
	// Now is the clock for decoding events (time.Now if nil).
	Now func() time.Time
	// Store is the heal's store on the pool, for Look (nil: Look does
	// nothing). run's pool is made after the Healer (its AfterConnect is
	// the Healer's check): SetStore sets it then.
	Store Store
}

// SetStore sets Config.Store; call it before the consumer runs.
func (h *Healer) SetStore(st Store) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cfg.Store = st
}

// Healer is the heal of one replica: the check on each new connection,
// the watch that lifts the gate, and the gate as the consumer and the
// billing loops see it. Safe for concurrent use.
type Healer struct {
	cfg Config

	up      atomic.Bool
	mu      sync.Mutex
	ranges  map[int]Range // the gate; nil while down
	healed  map[int]bool  // partitions whose position reached Hi
	changed chan struct{} // closed at the next change
	passes  map[uint64]context.CancelFunc
	nextID  uint64
	// server is the database server this replica's connections reach
	// (Check's server), checked whether Kafka's side was read on it.
	server  string
	checked bool
	// raised counts the times the gate went up: a view read before a
	// raise must not lower it (see lower).
	raised uint64
}

// New returns a Healer with the gate down.
func New(cfg Config) *Healer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Healer{cfg: cfg, changed: make(chan struct{}), passes: map[uint64]context.CancelFunc{}}
}

// Check is the check on a new connection (st works on it) to the database
// server named server (its identity: it changes with a failover, a
// restore or a restart). A new server first makes the replica forget its
// uncommitted decisions (OnNewServer). Then the gate that is up if any;
// else, on the first connection to a server, Kafka's committed offsets
// and marks, then the database's positions: a proven loss installs the
// gate. Later connections to the same server read only the gate (no
// Kafka: a recycled connection must not need it), and the watch loop
// keeps looking for a loss. It returns once this replica's view of the
// gate is the database's, and OnUp has run if it went up. An error fails
// the connection (pgx then retries with another), so that no connection
// is used before the check passed.
func (h *Healer) Check(ctx context.Context, st Store, server string) error {
	h.newServer(server)
	seen, up, err := h.readGate(ctx, st)
	if err != nil || up {
		return err
	}
	h.mu.Lock()
	checked := h.checked
	h.mu.Unlock()
	if checked {
		h.lower(seen)
		return nil
	}
	if err := h.look(ctx, st, seen); err != nil {
		return err
	}
	h.mu.Lock()
	if h.server == server {
		h.checked = true
	}
	h.mu.Unlock()
	return nil
}

// newServer notes the server a connection reached; a change (not the
// first) calls OnNewServer and forgets which partitions were healed.
func (h *Healer) newServer(server string) {
	h.mu.Lock()
	changed := h.server != "" && h.server != server
	if h.server != server {
		h.server, h.checked = server, false
		if h.healed != nil {
			h.healed = map[int]bool{}
		}
	}
	h.mu.Unlock()
	if changed {
		h.cfg.Logger.Warn("the database is another server than before (a failover, a restore or a restart): "+
			"forgetting the decisions not committed yet, their records will be delivered again", "group", h.cfg.Group)
		if h.cfg.OnNewServer != nil {
			h.cfg.OnNewServer()
		}
	}
}

// look reads Kafka and the positions and installs the gate on a proven
// loss; none lowers this replica's view of the gate, unless it went up
// since seen (a read that began before another raise is stale).
func (h *Healer) look(ctx context.Context, st Store, seen uint64) error {
	found, err := h.find(ctx, st)
	if err != nil {
		return err
	}
	plan := Plan(found)
	if plan == nil {
		h.lower(seen)
		return nil
	}
	return h.install(ctx, st, found, plan)
}

// Look is the check a consumer generation makes before its first commit
// (consumer.Gate): that commit writes the group's committed offsets as
// the positions, which would erase a loss no check has seen yet (a marked
// commit that reached Kafka after the new server's connections were
// checked). It returns once this replica's view of the gate reflects the
// group's committed offsets and the database's positions of now.
func (h *Healer) Look(ctx context.Context) error {
	h.mu.Lock()
	st := h.cfg.Store
	h.mu.Unlock()
	if st == nil {
		return nil
	}
	seen, up, err := h.readGate(ctx, st)
	if err != nil || up {
		return err
	}
	return h.look(ctx, st, seen)
}

// readGate reads the database's gate and, if one is up, makes it this
// replica's view. seen is the raise count before the read (see lower).
func (h *Healer) readGate(ctx context.Context, st Store) (seen uint64, up bool, err error) {
	seen = h.raises()
	gate, err := st.Gate(ctx)
	if err != nil || gate == nil {
		return seen, false, err
	}
	h.set(gate)
	return seen, true, nil
}

// find reads Kafka first, then the database, then the log bounds.
func (h *Healer) find(ctx context.Context, st Store) (map[int]Found, error) {
	ids, err := kafkagroup.Partitions(ctx, h.cfg.Client, h.cfg.Topic)
	if err != nil {
		return nil, err
	}
	commits, err := kafkagroup.CommittedMarks(ctx, h.cfg.Client, h.cfg.Group, h.cfg.Topic, ids)
	if err != nil {
		return nil, err
	}
	pos, err := st.Positions(ctx)
	if err != nil {
		return nil, err
	}
	found := make(map[int]Found, len(ids))
	lost := false
	for _, id := range ids {
		c, hasCommit := commits[id]
		p, hasPos := pos[id]
		f := Found{Committed: c, HasCommit: hasCommit, Position: p, HasPosition: hasPos}
		found[id] = f
		lost = lost || f.Lost()
	}
	if !lost {
		return found, nil
	}
	bounds, err := kafkagroup.LogBounds(ctx, h.cfg.Client, h.cfg.Topic)
	if err != nil {
		return nil, err
	}
	for id, f := range found {
		f.First, f.End = bounds[id].First, bounds[id].End
		found[id] = f
	}
	return found, nil
}

// install re-reads the ranges, finds the suspects and installs the gate
// (or takes the one another replica installed meanwhile).
func (h *Healer) install(ctx context.Context, st Store, found map[int]Found, plan map[int]Range) error {
	evs, err := readRanges(ctx, h.cfg.Reader, plan, h.cfg.Now())
	if err != nil {
		return fmt.Errorf("failover heal: %w", err)
	}
	suspects := Suspects(evs)
	gate, blocked, mine, err := st.Install(ctx, plan, suspects, h.cfg.Replica, h.cfg.Window)
	if err != nil {
		return fmt.Errorf("failover heal: install the gate: %w", err)
	}
	if mine {
		h.report(found, gate, blocked, len(suspects))
	}
	h.set(gate)
	return nil
}

// report logs the heal once per partition and counts it.
func (h *Healer) report(found map[int]Found, gate map[int]Range, blocked, suspects int) {
	log := h.cfg.Logger.With("group", h.cfg.Group, "topic", h.cfg.Topic)
	for _, id := range slices.Sorted(maps.Keys(gate)) {
		r, f := gate[id], found[id]
		args := []any{"partition", id, "committed", r.Committed, "position", r.Position,
			"re_decide_from", r.Lo, "target", r.Hi, "rewound", max(0, r.Committed-r.Lo)}
		switch {
		case f.Expired() > 0:
			h.cfg.Logger.Error("failover heal: records whose decisions were lost were deleted by retention and cannot be re-decided",
				append(args, "expired", f.Expired())...)
		case f.Lost():
			log.Warn("failover heal: the database lost decisions Kafka had committed; re-deciding them", args...)
		default:
			log.Info("failover heal: re-deciding the records past the committed offset", args...)
		}
	}
	log.Warn("failover heal: gate up, billing held on every replica until the ranges are re-decided",
		"rewound_records", Rewound(gate), "blocked_orders", blocked, "orders_with_several_events", suspects)
	if h.cfg.OnHeal != nil {
		h.cfg.OnHeal(Rewound(gate), blocked)
	}
}

// Watch is the watch loop's pass: with no gate up it looks for a loss as
// a new server's first connection does (one can become visible later: a
// position write the dying primary acknowledged, whose offset commit
// reached Kafka after the promotion); with a gate up it lifts it when
// every position has reached its target, and notes the partitions
// already healed (a partition assigned later need not be rewound again).
func (h *Healer) Watch(ctx context.Context, st Store) error {
	seen := h.raises()
	gate, err := st.Gate(ctx)
	if err != nil {
		return err
	}
	if gate == nil {
		h.lower(seen) // at once: a lift must not wait for Kafka
		return h.look(ctx, st, seen)
	}
	down, err := st.Lift(ctx)
	if err != nil {
		return err
	}
	if down {
		h.cfg.Logger.Warn("failover heal: every range re-decided, gate lifted", "group", h.cfg.Group, "topic", h.cfg.Topic)
		h.lower(seen)
		return nil
	}
	pos, err := st.Positions(ctx)
	if err != nil {
		return err
	}
	h.set(gate)
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, r := range h.ranges {
		if p, ok := pos[id]; ok && p >= r.Hi {
			h.healed[id] = true
		}
	}
	return nil
}
