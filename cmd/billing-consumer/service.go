package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/heal"
	"github.com/billing-consumer/billing-consumer/internal/kafkaconn"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/pipeline"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/pause"
	"github.com/billing-consumer/billing-consumer/internal/tracing"
)

// service is `billing-consumer run`, in the shape of wtf's Main: newService
// builds every part without waiting for a dependency (the pool and the
// Kafka clients connect lazily), Run starts, owns and waits for every
// goroutine, and Close releases the parts in the reverse order of their
// construction. Nothing here reads the environment: cfg is given.
type service struct {
	cfg    config
	logger *slog.Logger
	reg    *prometheus.Registry
	m      *metrics.Metrics
	ctl    *metrics.Control // billing_paused, billing_kafka_partition_owned
	// durable is what the role sees of the ledger's durability, read at
	// startup (checkDurability).
	durable *metrics.Durability
	pause   *pause.Watcher
	kconns  *kafkaconn.Conns
	// heal is the failover heal: its check runs on every new connection
	// of db's pool, its gate holds the consumer and the loops that bill.
	heal      *heal.Healer
	healGauge prometheus.Gauge // billing_failover_healing
	// consumerRef is consumer for the heal's hooks, which the pool's
	// connections may call before newBilling has set consumer.
	consumerRef atomic.Pointer[consumer.Consumer]

	db       *postgres.DB
	payer    *payment.Client
	handler  *pipeline.Handler
	consumer *consumer.Consumer
	consume  func(context.Context) error // consumer.Run; a test may replace it
	group    *groupWatcher               // the brokers' view of the group's assignment
	guard    *schemaGuard                // the schema accepts this binary; its registration
	replica  string                      // this replica's id in billing_replica and claim_send
	// stopConsuming ends the consumer's context without ending Run's: the
	// guard calls it (through refuse) when the schema stops accepting
	// this binary. Set by Run before the loops start.
	stopConsuming context.CancelFunc
	// stopBilling ends the loops that send charges (the completer, the
	// deferred decisions): with stopConsuming, what refuse calls.
	stopBilling context.CancelFunc

	ready    *readiness
	ln       net.Listener
	srv      *http.Server
	pprofLn  net.Listener // nil unless BILLING_PPROF_ADDR is set
	pprofSrv *http.Server

	// consumerDone is closed when the consumer goroutine, once started
	// (consumerStarted), has returned; Close waits for it before it
	// releases what the consumer uses.
	consumerDone    chan struct{}
	consumerStarted bool
	// closers release the parts, run last to first by Close.
	closers []func()
}

// newService builds the service of cfg (validated for run). On error it
// has released whatever it had built.
func newService(ctx context.Context, cfg config, stderr io.Writer) (_ *service, err error) {
	s := &service{cfg: cfg, logger: newLogger(cfg, stderr), ready: newReadiness(), consumerDone: make(chan struct{})}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.kconns, err = kafkaConns(cfg, s.logger); err != nil {
		return nil, err
	}
	payTLS, err := paymentTLS(cfg)
	if err != nil {
		return nil, err
	}
	s.newMetrics()
	tracer, propagator, err := s.setupTracing(ctx)
	if err != nil {
		return nil, err
	}

	id := replicaID()
	s.replica = id
	s.heal = s.newHealer(id)
	if s.db, err = openDB(ctx, cfg, postgres.WithHeal(s.heal, cfg.KafkaGroupID, cfg.KafkaTopic)); err != nil {
		return nil, err
	}
	s.onClose(s.db.Close)
	s.heal.SetStore(postgres.NewHealStore(s.db, cfg.KafkaGroupID, cfg.KafkaTopic))
	s.pause = pauseWatcher(s)
	s.guard = &schemaGuard{
		register: func(ctx context.Context) error {
			return postgres.RegisterReplica(ctx, s.db, id, version, cfg.KafkaGroupID)
		},
		deregister: func(ctx context.Context) error { return postgres.DeregisterReplica(ctx, s.db, id) },
		refuse:     s.refuse,
	}

	auth, observe, err := paymentAuth(cfg, s.logger, s.m.Payment)
	if err != nil {
		return nil, err
	}
	payer, err := payment.New(payment.Config{
		Engine:  payment.Engine(cfg.PaymentClient),
		BaseURL: cfg.PaymentURL, Token: cfg.PaymentToken, Authorization: auth, Timeout: cfg.PaymentTimeout, MaxConns: cfg.Concurrency,
		Observe: observe, Proxy: http.ProxyFromEnvironment, TLS: payTLS,
		Propagator: propagator, Tracer: tracer,
	})
	if err != nil {
		return nil, err
	}
	s.onClose(payer.CloseIdleConnections)

	dlqWriter, err := dlq.NewWriter(dlq.WriterConfig{
		Brokers: cfg.KafkaBrokers, Topic: cfg.KafkaDLQTopic, GroupID: cfg.KafkaGroupID,
		Transport: s.kconns.Transport, Now: time.Now,
	})
	if err != nil {
		return nil, err
	}
	s.onClose(func() { _ = dlqWriter.Close() })

	s.payer = payer
	if err := s.newBilling(id, dlqWriter, tracer, propagator); err != nil {
		return nil, err
	}
	s.consume = s.consumer.Run
	limit, source, _ := memoryLimit()
	s.logger.Info("in-flight budget", "bytes", cfg.maxInflightBytes(), "max_record_bytes", cfg.KafkaMaxRecordBytes,
		"memory_limit", limit, "memory_limit_source", source)
	s.group = &groupWatcher{client: &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: s.kconns.Transport, Timeout: 10 * time.Second},
		topic: cfg.KafkaTopic, group: cfg.KafkaGroupID, consumer: s.consumer, logger: s.logger,
		report: s.m.Unowned(cfg.KafkaTopic, cfg.KafkaGroupID)}
	if err := s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

// newMetrics registers the process's, the Go runtime's and the service's
// metrics on a registry of the service's own (served by /metrics).
func (s *service) newMetrics() {
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.m = metrics.New(s.reg, version, commit)
	s.ctl = metrics.NewControl(s.reg, s.cfg.KafkaTopic)
	s.durable = metrics.NewDurability(s.reg)
}

// newHealer is the failover heal of replica id (internal/heal): when the
// gate goes up it abandons the consumer's in-flight work (the consumer
// restarts each partition from its range), and it counts what it heals.
func (s *service) newHealer(id string) *heal.Healer {
	cfg := s.cfg
	hm := metrics.NewHeal(s.reg)
	s.healGauge = hm.Healing
	return heal.New(heal.Config{
		Group: cfg.KafkaGroupID, Topic: cfg.KafkaTopic,
		Client: &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: s.kconns.Transport, Timeout: 10 * time.Second},
		Reader: kafkagroup.ReaderConfig{Brokers: cfg.KafkaBrokers, Topic: cfg.KafkaTopic, Dialer: s.kconns.Dialer,
			MaxBytes: cfg.KafkaMaxRecordBytes, Logger: s.logger},
		Replica: id, Logger: s.logger,
		Window: heal.Window{Deadline: cfg.sends(id).Deadline, ProviderBound: cfg.ProviderMaxProcessing},
		// The pool may connect in the background before newBilling has
		// built the consumer (pool_min_conns): nothing is in flight then.
		OnUp: func() {
			hm.Healing.Set(1)
			if c := s.consumerRef.Load(); c != nil {
				c.Abandon()
			}
		},
		OnNewServer: func() {
			if c := s.consumerRef.Load(); c != nil {
				c.Drop()
			}
		},
		OnHeal: func(rewound int64, blocked int) { hm.Rewound.Add(float64(rewound)); hm.Blocked.Add(float64(blocked)) },
	})
}

// newBilling builds what bills a record: the billing service (through the
// Batcher when BILLING_BATCH_SIZE > 1), the pipeline that retries, parks,
// defers and dead-letters around it, and the consumer that feeds it.
func (s *service) newBilling(id string, dlqWriter *dlq.Writer, tracer trace.Tracer, propagator propagation.TextMapPropagator) error {
	cfg := s.cfg
	svc, err := billing.New(billing.Config{Store: postgres.NewStore(s.db), Charger: s.payer.ForBilling(), Group: cfg.KafkaGroupID,
		Now: time.Now, Logger: s.logger, DBTimeout: cfg.DBTimeout, ClaimBlockAfter: cfg.ClaimBlockAfter, Sends: cfg.sends(id), Paused: s.paused})
	if err != nil {
		return err
	}
	var biller pipeline.Biller = svc
	if cfg.BatchSize > 1 {
		batcher := billing.NewBatcher(svc, billing.BatcherConfig{MaxBatch: cfg.BatchSize, MaxInFlight: int(cfg.dbMaxConns()) - reservedConns,
			Linger: cfg.BatchLinger, Callers: cfg.Concurrency, Observe: s.m.Batch})
		s.onClose(batcher.Close) // after the consumer has drained
		biller = batcher
	}
	pcfg := cfg.pipelineConfig()
	pcfg.Biller, pcfg.DLQ, pcfg.Decisions, pcfg.Parker, pcfg.Deferrer = biller, dlqWriter, svc, svc, svc
	pcfg.Metrics, pcfg.Logger, pcfg.Now = s.m, s.logger, time.Now
	pcfg.Tracer, pcfg.Propagator, pcfg.Gate = tracer, propagator, s.pause.Gate
	if s.handler, err = pipeline.New(pcfg); err != nil {
		return err
	}
	ccfg := cfg.consumerConfig()
	ccfg.Dialer, ccfg.Transport, ccfg.Logger, ccfg.Pause, ccfg.OnAssign = s.kconns.Dialer, s.kconns.Transport, s.logger, s.pause.Gate, s.ctl.Owned
	ccfg.OnCommit = s.m.Commit(cfg.KafkaTopic, cfg.KafkaGroupID, time.Now)
	ccfg.Positions, ccfg.OnPositionsFailed = &postgres.Positions{DB: s.db}, metrics.NewPositionWritesFailed(s.reg).Inc
	ccfg.Gate = s.heal
	if s.consumer, err = consumer.New(ccfg, s.handler.Handle); err != nil {
		return err
	}
	s.consumerRef.Store(s.consumer)
	return nil
}

// pipelineConfig is the pipeline's configuration from the environment:
// its retry settings, which validate checks (pipeline.Config.Validate)
// and newBilling completes with the pipeline's dependencies.
func (c config) pipelineConfig() pipeline.Config {
	return pipeline.Config{MaxAttempts: c.MaxAttempts, OutageThreshold: c.OutageThreshold,
		RetryBudget: c.RetryBudget, OutageAfter: c.OutageAfter, ParkAfter: c.ParkAfter,
		BackoffBase: c.RetryBackoff, BackoffMax: c.RetryBackoffMax}
}

// consumerConfig is the consumer's configuration from the environment,
// which validate checks (consumer.Config.Validate) and newBilling
// completes with the consumer's dependencies.
func (c config) consumerConfig() consumer.Config {
	return consumer.Config{Brokers: c.KafkaBrokers, Topic: c.KafkaTopic, GroupID: c.KafkaGroupID,
		Concurrency: c.Concurrency, MaxInFlightBytes: c.maxInflightBytes(), MaxRecordBytes: c.KafkaMaxRecordBytes,
		CommitInterval: c.KafkaCommitInterval, DrainTimeout: c.DrainTimeout, SessionTimeout: c.KafkaSessionTimeout,
		RebalanceTimeout: c.KafkaRebalanceTimeout, HeartbeatInterval: c.KafkaHeartbeatInterval}
}

// listen opens the listeners of the ops endpoints and, when configured,
// of pprof: an address in use is a configuration error, reported before
// anything runs.
func (s *service) listen() error {
	ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("BILLING_HTTP_ADDR: %w", err)
	}
	s.ln = ln
	s.onClose(func() { _ = ln.Close() }) // Serve closes it too; a second Close is harmless
	s.srv = &http.Server{Handler: opsHandler(s.reg, s.readyCheck, s.readyDetail), ReadHeaderTimeout: 5 * time.Second}
	if s.cfg.PprofAddr == "" {
		return nil
	}
	pln, err := net.Listen("tcp", s.cfg.PprofAddr)
	if err != nil {
		return fmt.Errorf("BILLING_PPROF_ADDR: %w", err)
	}
	s.pprofLn = pln
	s.onClose(func() { _ = pln.Close() })
	s.pprofSrv = &http.Server{Handler: pprofHandler(), ReadHeaderTimeout: 5 * time.Second}
	return nil
}

// setupTracing starts the span exporter; Close flushes it last, so the
// drain's spans go too. Spans are exported only when
// OTEL_EXPORTER_OTLP_ENDPOINT is set; an incoming traceparent is
// propagated either way. The OTEL_* variables are the SDK's own, read with
// os.Getenv as envconfig reads BILLING_*.
func (s *service) setupTracing(ctx context.Context) (trace.Tracer, propagation.TextMapPropagator, error) {
	tp, stopTracing, err := tracing.Setup(ctx, os.Getenv, s.logger, "billing-consumer", version)
	if err != nil {
		return nil, nil, err
	}
	s.onClose(func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := stopTracing(tctx); err != nil {
			s.logger.Warn("flushing spans at shutdown", "err", err)
		}
	})
	return tp.Tracer(tracing.ScopeName), tracing.Propagator(), nil
}

// refuse stops billing for good on a schema that no longer accepts this
// binary: one log line, /readyz unready with the reason, the consumer
// drained and out of the group. The process stays up until it is
// stopped (a rollout replaces it).
func (s *service) refuse(reason string) {
	s.logger.Error("the schema no longer accepts this binary: stopped billing", "reason", reason)
	s.ready.set(reason)
	s.stopConsuming()
	s.stopBilling()
}

// readyDetail is /readyz's detail: the pause, then the partitions with
// lag that no member owns, each on its own line when there is one.
func (s *service) readyDetail() string {
	var lines []string
	for _, d := range []string{s.pauseDetail(), s.group.detail()} {
		if d != "" {
			lines = append(lines, d)
		}
	}
	return strings.Join(lines, "\n")
}

func (s *service) onClose(f func()) { s.closers = append(s.closers, f) }

// Close releases the parts in reverse order: the batcher before the DLQ
// writer before the pool, the span exporter last. If the consumer
// goroutine outlived Run's shutdown bound, Close waits for it a little
// longer and, should it still run, leaves the parts it uses to the
// process exit rather than close them under it. Close is called once.
func (s *service) Close() {
	if s.consumerStarted {
		select {
		case <-s.consumerDone:
		default:
			select {
			case <-s.consumerDone:
			case <-time.After(5 * time.Second):
				s.logger.Error("the consumer is still running after the shutdown bound; its resources are left to the process exit")
				return
			}
		}
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}
