package harness

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// CutKind names the step of a billing transaction a connection cut aims at.
type CutKind string

// The kinds of cut a Cutter makes.
const (
	// CutInFlight: a charge request reached the provider; before it is
	// answered, every backend of the database that is idle in a
	// transaction (a transaction waiting on the provider) is terminated.
	CutInFlight CutKind = "charge in flight"
	// CutAnswered: the provider just sent an answer; a share of the
	// proxied connections is cut while the consumer records the charge and
	// commits.
	CutAnswered CutKind = "answer sent, before commit"
	// CutBeforeCommit: a connection is cut as it sends COMMIT, before the
	// server gets it (after a charge: between the provider's answer and
	// COMMIT, exactly).
	CutBeforeCommit CutKind = "before COMMIT"
	// CutBeforeClaim: a connection is cut as it sends the ledger claim (an
	// INSERT INTO charge), before the server gets it.
	CutBeforeClaim CutKind = "before the claim"
	// CutClaimWait: every backend waiting on a lock (an event blocked on
	// another transaction's claim of its order) is terminated, before it
	// gets its claim.
	CutClaimWait CutKind = "waiting for a claim"
	// CutRandom: a share of the proxied connections is cut at a random
	// moment, whatever step each is at (BEGIN, the dedup insert, the claim,
	// COMMIT, idle in the pool).
	CutRandom CutKind = "random moment"
)

// CutKinds lists every CutKind, in the order reports print them.
var CutKinds = []CutKind{CutInFlight, CutAnswered, CutBeforeCommit, CutBeforeClaim, CutClaimWait, CutRandom}

// CutCount is what a Cutter did of one kind.
type CutCount struct {
	Actions int // cuts made
	Conns   int // connections they killed
}

// CutConfig paces a Cutter.
type CutConfig struct {
	// Every is the mean gap between two cuts of one kind (each gap drawn
	// uniformly in [Every/2, 3*Every/2)); the provider hooks fire on the
	// first charge request or answer after the gap.
	Every time.Duration
	// Share is the probability that a proxy cut (CutAnswered, CutRandom)
	// takes any one live connection.
	Share float64
	// Spare keeps the share cuts (CutAnswered, CutRandom) off connections
	// younger than this (see PGProxy.CutShare).
	Spare time.Duration
	Seed  uint64
}

// Cutter cuts the database connections of billing-consumer processes at
// every step of their billing transactions: through a PGProxy they connect
// by (its Tap sees their statements), and with pg_terminate_backend from
// admin, a pool that bypasses the proxy, on the database named dbName.
// Hooks aims cuts at the provider's activity; Run makes the timed ones.
// Nothing is cut while it is paused (see SetActive). Safe for concurrent
// use.
type Cutter struct {
	proxy  *PGProxy
	admin  *pgxpool.Pool
	dbName string
	cfg    CutConfig
	active atomic.Bool

	mu     sync.Mutex
	rng    *rand.Rand
	next   map[CutKind]time.Time
	counts map[CutKind]CutCount
	failed int
}

// NewCutter returns an active Cutter; it installs its Tap on proxy.
func NewCutter(proxy *PGProxy, admin *pgxpool.Pool, dbName string, cfg CutConfig) *Cutter {
	c := &Cutter{proxy: proxy, admin: admin, dbName: dbName, cfg: cfg,
		rng: rand.New(rand.NewPCG(cfg.Seed, 23)), next: map[CutKind]time.Time{}, counts: map[CutKind]CutCount{}}
	c.active.Store(true)
	proxy.SetTap(c.tap)
	return c
}

// tap makes the CutBeforeCommit and CutBeforeClaim cuts.
func (c *Cutter) tap(sql string) bool {
	kind := CutBeforeClaim
	switch q := strings.ToLower(strings.TrimSpace(sql)); {
	case q == "commit":
		kind = CutBeforeCommit
	case strings.Contains(q, "insert into charge"):
	default:
		return false
	}
	if !c.due(kind) {
		return false
	}
	c.record(kind, 1)
	return true
}

// SetActive turns the cutting on or off (off: for the final drain).
func (c *Cutter) SetActive(on bool) { c.active.Store(on) }

// Hooks are the provider hooks that make the CutInFlight and CutAnswered
// cuts; give them to paysim.Sim.SetHooks.
func (c *Cutter) Hooks() paysim.Hooks {
	return paysim.Hooks{
		Received: func(paysim.Request) {
			if c.due(CutInFlight) {
				c.terminate(CutInFlight, "state = 'idle in transaction'")
			}
		},
		Answered: func(_ paysim.Request, status int) {
			if status != 0 && c.due(CutAnswered) {
				c.record(CutAnswered, c.proxy.CutShare(c.cfg.Share, c.cfg.Spare))
			}
		},
	}
}

// Run makes the CutClaimWait and CutRandom cuts until ctx ends.
func (c *Cutter) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.cfg.Every / 4):
		}
		if c.due(CutClaimWait) {
			c.terminate(CutClaimWait, "wait_event_type = 'Lock'")
		}
		if c.due(CutRandom) {
			c.record(CutRandom, c.proxy.CutShare(c.cfg.Share, c.cfg.Spare))
		}
	}
}

// due reports whether a cut of kind is due now, and if so schedules the
// next one.
func (c *Cutter) due(kind CutKind) bool {
	if !c.active.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if now.Before(c.next[kind]) {
		return false
	}
	c.next[kind] = now.Add(c.cfg.Every/2 + time.Duration(c.rng.Int64N(int64(c.cfg.Every))))
	return true
}

// terminate kills, with pg_terminate_backend, every backend of the
// database (but the admin's own) that matches where.
func (c *Cutter) terminate(kind CutKind, where string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var n int
	err := c.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = $1 AND pid <> pg_backend_pid() AND `+where, c.dbName).Scan(&n)
	if err != nil { // Postgres restarting: no cut this time
		c.mu.Lock()
		c.failed++
		c.mu.Unlock()
		return
	}
	c.record(kind, n)
}

func (c *Cutter) record(kind CutKind, conns int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.counts[kind]
	n.Actions++
	n.Conns += conns
	c.counts[kind] = n
}

// Counts returns what was cut so far, by kind, and the total of
// connections killed.
func (c *Cutter) Counts() (map[CutKind]CutCount, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[CutKind]CutCount, len(c.counts))
	total := 0
	for k, n := range c.counts {
		out[k] = n
		total += n.Conns
	}
	return out, total
}

// Failed returns how many pg_terminate_backend rounds could not run (the
// server was down).
func (c *Cutter) Failed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}
