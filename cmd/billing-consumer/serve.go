package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/dedup"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/pipeline"
	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// serve is `billing-consumer run`: consume until ctx is cancelled, then shut
// down in order: stop fetching and drain in-flight events (bounded by
// BILLING_DRAIN_TIMEOUT), commit, leave the group, stop the background
// loops and the HTTP server, close the DLQ writer and the pool. The whole
// shutdown is bounded by BILLING_SHUTDOWN_TIMEOUT.
func serve(ctx context.Context, args []string, stderr io.Writer) error {
	if err := noFlags("run", args); err != nil {
		return err
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	if err := cfg.validate(need{kafka: true, payment: true}); err != nil {
		return err
	}
	kconns, err := kafkaConns(cfg)
	if err != nil {
		return err
	}
	payTLS, err := paymentTLS(cfg)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	// Spans are exported only when OTEL_EXPORTER_OTLP_ENDPOINT is set; an
	// incoming traceparent is propagated either way. Flushed last, so the
	// drain's spans go too.
	tp, stopTracing, err := tracing.Setup(ctx, os.Getenv, logger, "billing-consumer", version)
	if err != nil {
		return err
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := stopTracing(tctx); err != nil {
			logger.Warn("flushing spans at shutdown", "err", err)
		}
	}()
	tracer, propagator := tp.Tracer(tracing.ScopeName), tracing.Propagator()

	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	payer, err := payment.New(payment.Config{
		BaseURL:  cfg.PaymentURL,
		Token:    cfg.PaymentToken,
		Timeout:  cfg.PaymentTimeout,
		MaxConns: cfg.Concurrency,
		Observe: func(code string, elapsed time.Duration) {
			m.PaymentRequests.WithLabelValues(code).Inc()
			m.PaymentDuration.Observe(elapsed.Seconds())
		},
		Proxy: http.ProxyFromEnvironment,
		TLS:   payTLS,

		Propagator: propagator,
		Tracer:     tracer,
	})
	if err != nil {
		return err
	}
	defer payer.CloseIdleConnections()

	if err := checkKafka(ctx, kconns, cfg, logger); err != nil {
		return err
	}
	transport := kconns.Transport // TLS and SASL; one pool for the DLQ writer and the lag client
	dlqWriter, err := dlq.NewWriter(dlq.WriterConfig{
		Brokers: cfg.KafkaBrokers, Topic: cfg.KafkaDLQTopic, GroupID: cfg.KafkaGroupID,
		Transport: transport, Now: time.Now,
	})
	if err != nil {
		return err
	}
	defer dlqWriter.Close()

	svc, err := billing.New(billing.Config{DB: pool, Charger: payer, Group: cfg.KafkaGroupID,
		Now: time.Now, Logger: logger, DBTimeout: cfg.DBTimeout, ClaimBlockAfter: cfg.ClaimBlockAfter})
	if err != nil {
		return err
	}
	var biller pipeline.Biller = svc
	if cfg.BatchSize > 1 {
		batcher := billing.NewBatcher(svc, cfg.BatchSize,
			int(cfg.dbMaxConns())-reservedConns, func(n int) { m.BatchSize.Observe(float64(n)) })
		defer batcher.Close() // after the consumer has drained
		biller = batcher
	}
	handler, err := pipeline.New(pipeline.Config{
		Biller:          biller,
		DLQ:             dlqWriter,
		Metrics:         m,
		Logger:          logger,
		Now:             time.Now,
		MaxAttempts:     cfg.MaxAttempts,
		OutageThreshold: cfg.OutageThreshold,
		RetryBudget:     cfg.RetryBudget,
		OutageAfter:     cfg.OutageAfter,
		BackoffBase:     cfg.RetryBackoff,
		BackoffMax:      cfg.RetryBackoffMax,
		Tracer:          tracer,
		Propagator:      propagator,
	})
	if err != nil {
		return err
	}
	topic := cfg.KafkaTopic
	cons, err := consumer.New(consumer.Config{
		Brokers:          cfg.KafkaBrokers,
		Topic:            topic,
		GroupID:          cfg.KafkaGroupID,
		Dialer:           kconns.Dialer,
		Concurrency:      cfg.Concurrency,
		PartitionWindow:  cfg.PartitionWindow,
		CommitInterval:   cfg.KafkaCommitInterval,
		DrainTimeout:     cfg.DrainTimeout,
		SessionTimeout:   cfg.KafkaSessionTimeout,
		RebalanceTimeout: cfg.KafkaRebalanceTimeout,
		Logger:           logger,
		OnCommit: func(partition int, offset int64, fetched []time.Time) {
			m.CommittedOffset.WithLabelValues(topic, strconv.Itoa(partition)).Set(float64(offset))
			now := time.Now()
			for _, t := range fetched {
				m.EventDuration.Observe(now.Sub(t).Seconds())
			}
		},
	}, handler.Handle)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("BILLING_HTTP_ADDR: %w", err)
	}
	srv := &http.Server{
		Handler:           opsHandler(reg, readiness(pool, cons, handler)),
		ReadHeaderTimeout: 5 * time.Second,
	}

	// Background loops, each owned here and waited for before return.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server", "err", err)
		}
	})
	wg.Go(func() {
		maintainer(cfg, pool, logger).Run(bg, cfg.RetentionInterval, func(p dedup.Pass) {
			m.DedupPartitions.Set(float64(p.Partitions))
		})
	})
	wg.Go(func() {
		completer(cfg, pool, payer, logger).Run(bg, cfg.CompleterInterval, func(u billing.Unsettled) {
			m.LedgerClaims.WithLabelValues("pending").Set(float64(u.Pending))
			m.LedgerClaims.WithLabelValues("blocked").Set(float64(u.Blocked))
			m.LedgerOldestPending.Set(u.OldestPending.Seconds())
		})
	})
	wg.Go(func() {
		client := &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: transport, Timeout: 10 * time.Second}
		consumer.WatchLag(bg, client, topic, cfg.KafkaGroupID, cfg.KafkaLagInterval, logger, func(lags []consumer.PartitionLag) {
			for _, l := range lags {
				p := strconv.Itoa(l.Partition)
				m.ConsumerLag.WithLabelValues(topic, p).Set(float64(l.Lag))
				if l.Committed >= 0 {
					m.CommittedOffset.WithLabelValues(topic, p).Set(float64(l.Committed))
				}
			}
		})
	})

	logger.Info("billing-consumer started", "version", version, "topic", topic, "group", cfg.KafkaGroupID,
		"dlq_topic", cfg.KafkaDLQTopic, "http_addr", ln.Addr().String())
	runErr := make(chan error, 1)
	go func() { runErr <- cons.Run(ctx) }()

	var consErr error
	select {
	case consErr = <-runErr:
	case <-ctx.Done():
		logger.Info("shutdown requested, draining")
		select {
		case consErr = <-runErr:
		case <-time.After(cfg.ShutdownTimeout):
			consErr = errors.New("shutdown timed out: in-flight events abandoned, they will be redelivered")
		}
	}
	stopBG()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	wg.Wait()
	if consErr != nil {
		return fmt.Errorf("consumer: %w", consErr)
	}
	logger.Info("billing-consumer stopped cleanly")
	return nil
}

// opsHandler serves /metrics from reg, /healthz (the process answers:
// never a dependency check, or a database outage would restart every pod)
// and /readyz (ready() == nil).
func opsHandler(reg *prometheus.Registry, ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// readiness is ready when the database answers, the consumer is a group
// member, and no event is waiting out a systemic failure.
func readiness(pool *pgxpool.Pool, cons *consumer.Consumer, h *pipeline.Handler) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return errors.New("database unreachable")
		}
		if !cons.Joined() {
			return errors.New("not a consumer group member")
		}
		if h.Stalled() {
			return errors.New("paused by a systemic failure")
		}
		return nil
	}
}
