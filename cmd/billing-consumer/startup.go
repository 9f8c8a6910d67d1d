package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/kafkaconn"
)

// readiness holds why the service is not ready yet ("" once startup is
// done); /readyz reports it.
type readiness struct{ reason atomic.Pointer[string] }

func newReadiness() *readiness {
	r := &readiness{}
	r.set("starting")
	return r
}

func (r *readiness) set(reason string) { r.reason.Store(&reason) }
func (r *readiness) get() string       { return *r.reason.Load() }

// readyCheck is /readyz: not ready while starting up (with the step it
// waits for), then ready when the database answers, the consumer is a
// group member that owns partitions or idles only because every partition
// is taken (see groupWatcher), and no event is waiting out a systemic
// failure.
func (s *service) readyCheck(ctx context.Context) error {
	if r := s.ready.get(); r != "" {
		return errors.New(r)
	}
	if err := s.db.Ping(ctx); err != nil {
		return errors.New("database unreachable")
	}
	if !s.consumer.Joined() {
		return errors.New("not a consumer group member")
	}
	if err := s.group.notReady(); err != nil {
		return err
	}
	if s.handler.Stalled() {
		return errors.New("paused by a systemic failure")
	}
	return nil
}

// permanent marks a startup error that waiting cannot fix (credentials the
// brokers refuse): Run returns it and the process exits.
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

// startup waits for each dependency in turn, retrying with capped
// exponential backoff and jitter: Kafka, the database, its schema version,
// what the database shows of its durability (logged, never waited for),
// the pause state, then one dedup maintenance pass (so that the first
// events of a fresh database find their processed_event partitions). It returns nil when all
// are done, the permanent error of a step, or, when ctx ends first, an
// errStoppedBeforeReady naming the step it was waiting for.
func (s *service) startup(ctx context.Context) error {
	steps := []struct {
		name  string
		check func(context.Context) error
	}{
		// Kafka first: credentials it refuses end the process at once.
		{"Kafka", s.checkKafka},
		{"the database", func(ctx context.Context) error { return s.db.Ping(ctx) }},
		{"the schema", s.guard.check},
		// Logged and exported, never waited for: see checkDurability.
		{"the database's durability", s.checkDurability},
		// Before joining the group: a replica started during a pause
		// fetches nothing.
		{"the pause state", s.pause.Refresh},
		{"dedup partition maintenance", func(ctx context.Context) error {
			p, err := maintainer(s.cfg, s.db, s.logger).RunOnce(ctx)
			if err == nil {
				s.m.DedupPass(p.Partitions)
			}
			return err
		}},
	}
	for _, st := range steps {
		if err := s.waitFor(ctx, st.name, st.check); err != nil {
			return err
		}
	}
	return nil
}

// errStoppedBeforeReady wraps startup's error when ctx ended first.
var errStoppedBeforeReady = errors.New("stopped before ready")

// waitFor calls check until it succeeds. Each failure sets /readyz's
// reason; a change of reason is logged once, not every attempt.
func (s *service) waitFor(ctx context.Context, name string, check func(context.Context) error) error {
	delay := 250 * time.Millisecond
	var logged string
	for {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			if logged != "" {
				s.logger.Info("startup step done", "step", name)
			}
			return nil
		}
		if p := (permanent{}); errors.As(err, &p) {
			return p.error
		}
		reason := fmt.Sprintf("waiting for %s: %v", name, err)
		s.ready.set(reason)
		if ctx.Err() != nil {
			return fmt.Errorf("%w, %s", errStoppedBeforeReady, reason)
		}
		if reason != logged {
			s.logger.Warn("not ready", "step", name, "err", err.Error())
			logged = reason
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w, %s", errStoppedBeforeReady, reason)
		case <-time.After(delay + rand.N(delay/5+1)):
		}
		delay = min(2*delay, s.cfg.StartupBackoffMax)
	}
}

// checkKafka connects once to the brokers, TLS and SASL included. A
// rejected password or certificate is permanent (a configuration error,
// one line naming the variables to check); an unreachable broker is waited
// for.
func (s *service) checkKafka(ctx context.Context) error {
	err := s.kconns.Check(ctx, s.cfg.KafkaBrokers)
	var ce *kafkaconn.CheckError
	if errors.As(err, &ce) {
		switch ce.Kind {
		case kafkaconn.AuthFailed, kafkaconn.TLSFailed:
			return permanent{kafkaCheckError(err, ce)}
		}
	}
	return err
}
