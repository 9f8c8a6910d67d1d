package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/billing-consumer/billing-consumer/db/migrations"
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

// run refreshes the registration every interval until ctx ends or the
// schema no longer accepts this binary, and deregisters at the end.
func (g *schemaGuard) run(ctx context.Context, interval time.Duration, warn func(msg string, args ...any)) {
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := g.deregister(dctx); err != nil {
			warn("could not deregister this replica; its row goes stale in a minute", "err", err)
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, interval)
		err := g.register(qctx)
		cancel()
		var inc *migrations.IncompatibleError
		switch {
		case errors.As(err, &inc):
			g.once.Do(func() { g.refuse(inc.Error()) })
			return
		case err != nil && ctx.Err() == nil && err.Error() != failing:
			failing = err.Error()
			warn("schema check and replica heartbeat failed, retrying", "err", err)
		case err == nil:
			failing = ""
		}
	}
}
