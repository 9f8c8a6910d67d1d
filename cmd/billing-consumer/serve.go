package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/db/migrations"
	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/dedup"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
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

// loop is a background loop Run owns: it runs until its context ends. A
// loop that bills (sends charges) also ends when the schema guard refuses
// the schema (service.refuse), as the consumer does.
type loop struct {
	name  string
	bills bool
	run   func(context.Context)
}

// loops are the background loops Run starts once the service is ready,
// before it joins the consumer group, and stops after the consumer has
// drained.
func (s *service) loops() []loop {
	cfg := s.cfg
	client := &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: s.kconns.Transport, Timeout: 10 * time.Second}
	return []loop{
		{"dedup maintenance", false, func(ctx context.Context) {
			maintainer(cfg, s.pool, s.logger).Run(ctx, cfg.RetentionInterval, func(p dedup.Pass) { s.m.DedupPass(p.Partitions) })
		}},
		{"lag", false, func(ctx context.Context) {
			gauges := s.m.Lag(cfg.KafkaTopic, cfg.KafkaGroupID, 3*cfg.KafkaLagInterval, time.Now)
			consumer.WatchLag(ctx, client, cfg.KafkaTopic, cfg.KafkaGroupID, cfg.KafkaLagInterval, s.logger,
				func(l []consumer.PartitionLag, err error) { s.group.observeLag(l, err); gauges(l, err) })
		}},
		{"group assignment", false, func(ctx context.Context) { s.group.run(ctx, cfg.KafkaLagInterval) }},
		{"schema guard", false, func(ctx context.Context) { s.guard.run(ctx, migrations.HeartbeatInterval, s.logger.Warn) }},
		{"ledger completer", true, func(ctx context.Context) {
			completer(cfg, s.pool, s.payer.ForBilling(), s.logger, billing.SenderCompleter, s.replica, s.paused).Run(ctx, cfg.CompleterInterval, s.completerPass)
		}},
		{"deferred decisions", true, func(ctx context.Context) { s.handler.RunDeferred(ctx, time.Second) }},
		{"pause watch", false, s.pause.Run},
		{"dlq backlog", false, func(ctx context.Context) {
			dlq.WatchBacklog(ctx, client, cfg.KafkaDLQTopic, cfg.dlqReplayGroup(), cfg.DLQBacklogInterval, s.logger,
				func(b dlq.Backlog) { s.m.DLQBacklog(b.Records, b.Oldest, b.Retention, time.Now()) })
		}},
	}
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
		if l.bills {
			lctx = billingLoops
		}
		loops.Go(func() { l.run(lctx) })
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
