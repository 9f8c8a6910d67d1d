package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/loop"
)

// schemaGuard keeps this replica from billing on a schema it does not
// understand (docs/operations.md, Upgrade). At start (the startup step "the
// schema") and every migrations.HeartbeatInterval it checks the database's
// schema version and lowest compatible binary against this binary's level
// and, while they accept it, registers the replica as running (its
// heartbeat: `migrate` refuses a breaking step while it runs). When the
// schema stops accepting it (a breaking migration applied with
// --allow-breaking), it logs one line, deregisters, and calls refuse: the
// service stops consuming and stays up, unready, saying why.
type schemaGuard struct {
	register   func(ctx context.Context) error // check, then register or refresh
	deregister func(ctx context.Context) error
	refuse     func(reason string)

	once sync.Once
}

// replicaID names this replica in billing_replica: the host name (the pod
// name under Kubernetes) and a random suffix, since several processes may
// share a host.
func replicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "billing-consumer"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}

// check is the startup step: nil once the schema accepts this binary and
// the replica is registered; the error says what to do otherwise.
func (g *schemaGuard) check(ctx context.Context) error { return g.register(ctx) }

// runOnce is the schema guard loop's pass: check the schema and refresh
// the registration. When the schema no longer accepts this binary it
// refuses (once) and ends the loop (loop.ErrStop); any other error is the
// pass's, logged by the loop when it changes.
func (g *schemaGuard) runOnce(ctx context.Context) error {
	err := g.register(ctx)
	var inc *migrations.IncompatibleError
	if errors.As(err, &inc) {
		g.once.Do(func() { g.refuse(inc.Error()) })
		return fmt.Errorf("%w: %w", loop.ErrStop, err)
	}
	return err
}

// done deregisters the replica as the guard's loop ends (the service
// stops, or the schema refused it), bounded; warn logs a failure.
func (g *schemaGuard) done(ctx context.Context, warn func(msg string, args ...any)) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := g.deregister(dctx); err != nil {
		warn("could not deregister this replica; its row goes stale in a minute", "err", err)
	}
}
