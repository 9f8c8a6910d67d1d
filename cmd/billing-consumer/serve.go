package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/loop"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// serve is `billing-consumer run`: read and check the configuration, build
// the service, run it until ctx ends, release it.
//
// Why run and serve take no getenv (CONVENTIONS' run(ctx, args, getenv,
// ...)): the configuration is read by envconfig, which reads the process
// environment itself (os.LookupEnv) and takes no lookup function, and so
// does the OpenTelemetry SDK for its OTEL_* variables. A getenv parameter
// would be a promise the code does not keep; tests set the environment
// with t.Setenv instead. newService and Run take the config struct, so
// everything below the configuration is testable without an environment.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := noFlags("run", args, stdout); err != nil {
		return err
	}
	cfg, err := configFor(need{kafka: true, payment: true, consume: true})
	if err != nil {
		return err
	}
	s, err := newService(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Run(ctx)
}

// loops are the background loops Run starts once the service is ready,
// before it joins the consumer group, and stops after the consumer has
// drained: the one list of them, each a pass of its package run by
// loop.Loop. Those that bill (send charges) run on the billing context,
// which ends when the schema guard refuses the schema (service.refuse);
// each of their sends asks the pause itself (see loop.Loop.Bills).
func (s *service) loops() []loop.Loop {
	cfg := s.cfg
	client := &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: s.kconns.Transport, Timeout: 10 * time.Second}
	warn := func(msg string, args ...any) loop.Log { return loop.Log{Level: slog.LevelWarn, Msg: msg, Args: args} }
	maintain := maintainer(cfg, s.db, s.logger)
	lagGauges := s.m.Lag(cfg.KafkaTopic, cfg.KafkaGroupID, 3*cfg.KafkaLagInterval, time.Now)
	completerTick, completerPass := completer(cfg, s.db, s.payer.ForBilling(), s.logger, billing.SenderCompleter, s.replica, s.paused).
		Passes(cfg.CompleterInterval, s.completerPass)
	lagLog, backlogLog := warn("consumer lag unavailable"), warn("dead-letter backlog unavailable", "topic", cfg.KafkaDLQTopic)
	lagLog.Every, backlogLog.Every = time.Minute, 10*time.Minute
	guardLog := warn("schema check and replica heartbeat failed, retrying")
	guardLog.OnChange = true
	return []loop.Loop{
		{Name: "dedup maintenance", Interval: cfg.RetentionInterval, RunOnce: func(ctx context.Context) error {
			pass, err := maintain.RunOnce(ctx)
			if err == nil {
				s.m.DedupPass(pass.Partitions)
			}
			return err
		}, Failed: loop.Log{Level: slog.LevelError, Msg: "dedup retention pass failed"}},
		{Name: "lag", Interval: cfg.KafkaLagInterval, Timeout: cfg.KafkaLagInterval, Failed: lagLog,
			RunOnce: consumer.LagPass(client, cfg.KafkaTopic, cfg.KafkaGroupID,
				func(l []consumer.PartitionLag, err error) { s.group.observeLag(l, err); lagGauges(l, err) })},
		{Name: "group assignment", Interval: cfg.KafkaLagInterval, Timeout: cfg.KafkaLagInterval, RunOnce: s.group.runOnce,
			Failed: warn("cannot read the group's assignment from the brokers", "group", cfg.KafkaGroupID)},
		{Name: "schema guard", Interval: migrations.HeartbeatInterval, Wait: true, Timeout: migrations.HeartbeatInterval,
			RunOnce: s.guard.runOnce, Done: func(ctx context.Context) { s.guard.done(ctx, s.logger.Warn) }, Failed: guardLog},
		{Name: "ledger completer", Bills: true, Interval: completerTick, RunOnce: s.heal.Guard(completerPass),
			Failed: loop.Log{Level: slog.LevelError, Msg: "completer pass failed"}},
		{Name: "deferred decisions", Bills: true, Interval: time.Second, RunOnce: s.heal.Guard(s.handler.DecideDeferred),
			Failed: loop.Log{Level: slog.LevelError, Msg: "deferred decisions failed"}},
		{Name: "failover heal watch", Interval: healWatchInterval, Timeout: healWatchInterval + 5*time.Second, RunOnce: s.healWatch,
			Failed: warn("cannot read the failover heal's gate; keeping the last view", "group", cfg.KafkaGroupID)},
		{Name: "pause watch", Interval: pauseInterval, Wait: true, Timeout: pauseInterval + 5*time.Second, RunOnce: s.pause.Refresh,
			Failed: warn("cannot read the pause state; keeping the last one", "group", cfg.KafkaGroupID)},
		{Name: "dlq backlog", Interval: cfg.DLQBacklogInterval, Timeout: cfg.DLQBacklogInterval, Failed: backlogLog,
			RunOnce: dlq.BacklogPass(client, cfg.KafkaDLQTopic, cfg.dlqReplayGroup(),
				func(b dlq.Backlog) { s.m.DLQBacklog(b.Records, b.Oldest, b.Retention, time.Now()) })},
	}
}

// healWatchInterval is how often each replica reads the failover heal's
// gate: how long a lift takes to reach it.
const healWatchInterval = time.Second

// healWatch is the heal watch loop's pass (heal.Healer.Watch) and keeps
// billing_failover_healing.
func (s *service) healWatch(ctx context.Context) error {
	err := s.heal.Watch(ctx, postgres.NewHealStore(s.db, s.cfg.KafkaGroupID, s.cfg.KafkaTopic))
	if s.heal.Up() {
		s.healGauge.Set(1)
	} else {
		s.healGauge.Set(0)
	}
	return err
}

// Run serves /healthz at once, waits (unready, saying why) until the
// database answers with a schema that accepts this binary (see
// schemaGuard), one dedup maintenance pass has succeeded and Kafka
// answers, then starts the background loops and the consumer, and consumes
// until ctx ends, or until the schema guard refuses the schema: then the
// consumer drains and leaves the group, and Run waits, unready, for ctx to
// end. Shutdown: the consumer drains and
// commits (bounded by BILLING_SHUTDOWN_TIMEOUT), the loops stop (3s), the
// HTTP servers shut down (3s), then Close flushes spans (5s): 11s past
// BILLING_SHUTDOWN_TIMEOUT at worst. Every goroutine Run started has
// returned when it returns, except a consumer past its bound, which Close
// waits for. Run is called once.
func (s *service) Run(ctx context.Context) error {
	var servers sync.WaitGroup
	s.startServers(&servers)
	defer s.stopServers(ctx, &servers)
	s.logger.Info("billing-consumer started", "version", version, "topic", s.cfg.KafkaTopic, "group", s.cfg.KafkaGroupID,
		"dlq_topic", s.cfg.KafkaDLQTopic, "http_addr", s.ln.Addr().String())

	if err := s.startup(ctx); err != nil {
		if errors.Is(err, errStoppedBeforeReady) {
			// A SIGTERM during startup (a rollout while a dependency is
			// down) is a clean stop: nothing was consumed.
			s.logger.Info("billing-consumer stopped before ready", "reason", err.Error())
			return nil
		}
		return err
	}

	consuming, stopConsuming := context.WithCancel(ctx)
	defer stopConsuming()
	s.stopConsuming = stopConsuming
	bg, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoops()
	billingLoops, stopBilling := context.WithCancel(bg)
	defer stopBilling()
	s.stopBilling = stopBilling
	var loops sync.WaitGroup
	for _, l := range s.loops() {
		lctx := bg
		if l.Bills {
			lctx = billingLoops
		}
		loops.Go(func() { l.Run(lctx, s.logger) })
	}
	defer s.bounded("background loops", 3*time.Second, &loops, stopLoops)

	s.logger.Info("billing-consumer ready, joining the consumer group")
	s.ready.set("")
	s.consumerStarted = true
	runErr := make(chan error, 1)
	go func() {
		defer close(s.consumerDone)
		runErr <- s.consume(consuming)
	}()
	var consErr error
	select {
	case consErr = <-runErr:
		if consErr == nil && ctx.Err() == nil {
			// Refused by the schema guard: unready until stopped.
			<-ctx.Done()
		}
	case <-ctx.Done():
		s.logger.Info("shutdown requested, draining")
		select {
		case consErr = <-runErr:
		case <-time.After(s.cfg.ShutdownTimeout):
			consErr = errors.New("shutdown timed out: in-flight events abandoned, they will be redelivered")
		}
	}
	if consErr != nil {
		return fmt.Errorf("consumer: %w", consErr)
	}
	s.logger.Info("billing-consumer stopped cleanly")
	return nil
}

// startServers serves the ops endpoints (and pprof) from now on, each in a
// goroutine counted in wg.
func (s *service) startServers(wg *sync.WaitGroup) {
	wg.Go(func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("http server", "err", err)
		}
	})
	if s.pprofSrv != nil {
		wg.Go(func() {
			if err := s.pprofSrv.Serve(s.pprofLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.logger.Error("pprof server", "err", err)
			}
		})
		s.logger.Info("pprof listening", "addr", s.pprofLn.Addr().String())
	}
}

// stopServers shuts the HTTP servers down, bounded, and waits for them.
func (s *service) stopServers(ctx context.Context, wg *sync.WaitGroup) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(sctx)
	if s.pprofSrv != nil {
		_ = s.pprofSrv.Shutdown(sctx)
	}
	s.bounded("http servers", time.Second, wg, func() {
		_ = s.srv.Close()
		if s.pprofSrv != nil {
			_ = s.pprofSrv.Close()
		}
	})
}

// bounded calls stop, then waits for wg at most d, logging what it left.
func (s *service) bounded(what string, d time.Duration, wg *sync.WaitGroup, stop func()) {
	stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		s.logger.Error("shutdown step timed out", "step", what, "after", d.String())
	}
}

// completerPass sets the ledger metrics from one completer pass: what it
// settled, and the counts when it could read them.
func (s *service) completerPass(rep billing.PassReport) {
	for _, st := range rep.Settled {
		result := st.Result
		if result == billing.SettledMeanwhile {
			result = "moved"
		}
		s.m.CompleterSettled.WithLabelValues(result).Inc()
	}
	if !rep.Counted {
		return
	}
	u := rep.Unsettled
	s.m.LedgerClaims.WithLabelValues("pending").Set(float64(u.Pending))
	s.m.LedgerClaims.WithLabelValues("blocked").Set(float64(u.Blocked))
	s.m.LedgerOldestPending.Set(u.OldestPending.Seconds())
	s.m.ParkedEvents.Set(float64(u.Parked + u.Deferred))
}

// paused reports whether billing is paused: an operator's pause is in
// force as last read, or the pause has not been read yet (the consumer's
// Gate is closed then too). Every sender checks it (SPEC §11 I4): the
// completer and the billing service directly, the pipeline and its
// deciding loop through the Gate.
func (s *service) paused() bool {
	select {
	case <-s.pause.Gate():
		return false
	default:
		return true
	}
}
