package monitoring

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/model"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// RigConfig is what a Rig runs on.
type RigConfig struct {
	// Bin is the billing-consumer binary; Prometheus the prometheus one.
	Bin, Prometheus string
	Brokers         []string
	// DBURL is a fresh database; the rig migrates it. The replicas reach
	// it through a proxy that can take it away (SetDatabaseDown).
	DBURL string
	// Dir is a scratch directory (Prometheus' files and TSDB).
	Dir string
	// RulesDir is the kustomization whose PrometheusRule is loaded.
	RulesDir string
	// Namespace labels every series, as the namespace of the pods would.
	Namespace string
	// Partitions of the source topic; Replicas of billing-consumer.
	Partitions, Replicas int
	// PrometheusAddr is Prometheus' listen address; empty picks a free
	// loopback port.
	PrometheusAddr string
	// Interval is Prometheus' scrape and evaluation interval.
	Interval time.Duration
	// OrdersPerSecond is the steady traffic Produce sends.
	OrdersPerSecond int
	// Log receives the consumers' and Prometheus' output.
	Log io.Writer
}

// Rig is billing-consumer's replicas, their dependencies and the
// Prometheus server watching them.
type Rig struct {
	cfg                    RigConfig
	Sim                    *paysim.Sim
	Prom                   *Server
	Replicas               []*Replica
	Factor                 int
	topic, dlqTopic, group string
	sim                    *httptest.Server
	pg                     *harness.PGProxy
	dbURL                  string // through the proxy
	stopProducing          context.CancelFunc
	producing              sync.WaitGroup
	firstOrder             int64
}

// Replica is one billing-consumer process, scraped as pod Pod at Addr. A
// restarted replica keeps both, as a container restarted in its pod does.
type Replica struct {
	Pod, Addr string
	rig       *Rig
	mu        sync.Mutex
	proc      *harness.Process
}

// NewRig creates the topics, migrates the database, starts the simulator,
// the replicas (waiting until each is ready) and Prometheus, whose rules
// are the rendered PrometheusRule of cfg.RulesDir scaled by Factor. Close
// stops everything it started.
func NewRig(ctx context.Context, cfg RigConfig) (r *Rig, err error) {
	spec, err := Rules(cfg.RulesDir)
	if err != nil {
		return nil, err
	}
	r = &Rig{cfg: cfg, topic: kafkatest.UniqueName("orders"), dlqTopic: kafkatest.UniqueName("orders-dlq"),
		group: kafkatest.UniqueName("billing"), firstOrder: time.Now().UnixMilli()}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	// Ten scrapes in the shortest window: every rate() has samples.
	if r.Factor, err = Factor(spec, 10*cfg.Interval); err != nil {
		return nil, err
	}
	rules, err := Scaled(spec, r.Factor)
	if err != nil {
		return nil, err
	}
	for _, t := range []struct {
		name string
		n    int
	}{{r.topic, cfg.Partitions}, {r.dlqTopic, 1}} {
		if err := kafkatest.CreateTopicErr(ctx, cfg.Brokers, t.name, t.n); err != nil {
			return nil, err
		}
	}
	r.Sim = paysim.New(paysim.Config{Seed: 42, Faults: paysim.Faults{Latency: 2 * time.Millisecond}})
	r.sim = httptest.NewServer(r.Sim)
	u, err := url.Parse(cfg.DBURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if r.pg, err = harness.StartPGProxy(u.Host, 1); err != nil {
		return nil, err
	}
	if r.dbURL, err = r.pg.URL(cfg.DBURL); err != nil {
		return nil, err
	}
	for _, cmd := range []string{"migrate", "retention"} {
		if err := r.runOnce(ctx, cmd); err != nil {
			return nil, err
		}
	}
	var targets []Target
	for i := range cfg.Replicas {
		addr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		rep := &Replica{Pod: fmt.Sprintf("billing-consumer-%d", i), Addr: addr, rig: r}
		r.Replicas = append(r.Replicas, rep)
		targets = append(targets, Target{Addr: addr, Pod: rep.Pod})
		if err := rep.Start(ctx); err != nil {
			return nil, err
		}
	}
	if err := r.WaitBalanced(ctx); err != nil {
		return nil, err
	}
	promAddr := cfg.PrometheusAddr
	if promAddr == "" {
		if promAddr, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	r.Prom, err = StartServer(ctx, ServerConfig{Bin: cfg.Prometheus, Dir: cfg.Dir, Addr: promAddr,
		Namespace: cfg.Namespace, Job: "billing-consumer", Targets: targets, Interval: cfg.Interval,
		Rules: rules, Log: cfg.Log})
	return r, err
}

// env is the replicas' environment. The session timeout outlasts a
// replica held by SIGSTOP for the whole stall phase, so that the group
// does not hand its partitions to the other replica meanwhile; a killed
// replica restarts at once and rejoins within the rebalance timeout.
func (r *Rig) env(addr string) []string {
	return []string{
		"BILLING_KAFKA_BROKERS=" + strings.Join(r.cfg.Brokers, ","),
		"BILLING_KAFKA_TOPIC=" + r.topic,
		"BILLING_KAFKA_DLQ_TOPIC=" + r.dlqTopic,
		"BILLING_KAFKA_GROUP_ID=" + r.group,
		"BILLING_DATABASE_URL=" + r.dbURL,
		"BILLING_PAYMENT_URL=" + r.sim.URL,
		"BILLING_HTTP_ADDR=" + addr,
		"BILLING_KAFKA_SESSION_TIMEOUT=90s",
		"BILLING_KAFKA_REBALANCE_TIMEOUT=10s",
		"BILLING_DRAIN_TIMEOUT=5s",
		"BILLING_SHUTDOWN_TIMEOUT=20s",
		"BILLING_RETRY_BACKOFF=20ms",
		"BILLING_RETRY_BACKOFF_MAX=500ms",
		"BILLING_PAYMENT_TIMEOUT=2s",
		"BILLING_KAFKA_LAG_INTERVAL=1s",
		"BILLING_COMPLETER_AFTER=5s",
		"BILLING_COMPLETER_INTERVAL=1s",
		"BILLING_STARTUP_BACKOFF_MAX=1s",
	}
}

// runOnce runs a one-shot command of the binary (migrate, retention).
func (r *Rig) runOnce(ctx context.Context, cmd string) error {
	addr, err := FreeAddr()
	if err != nil {
		return err
	}
	p, err := harness.Start(r.cfg.Bin, []string{cmd}, r.env(addr), r.cfg.Log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.Wait(ctx); err != nil {
		p.Kill()
		return fmt.Errorf("billing-consumer %s: %w", cmd, err)
	}
	return nil
}

// Start runs the replica and waits (up to two minutes) until it is ready.
func (rep *Replica) Start(ctx context.Context) error {
	p, err := harness.Start(rep.rig.cfg.Bin, nil, rep.rig.env(rep.Addr), rep.rig.cfg.Log)
	if err != nil {
		return err
	}
	rep.mu.Lock()
	rep.proc = p
	rep.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.WaitReady(ctx, rep.Addr); err != nil {
		return fmt.Errorf("%s not ready: %w", rep.Pod, err)
	}
	return nil
}

func (rep *Replica) process() *harness.Process {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.proc
}

// WaitBalanced waits (up to two minutes) until the group is stable with
// every replica a member owning at least one partition and no partition
// left to nobody: a replica that is ready may still be joining, and one
// frozen then would hold nothing.
func (r *Rig) WaitBalanced(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(r.cfg.Brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	var last consumer.GroupAssignment
	for {
		a, err := consumer.AssignmentOf(ctx, client, r.topic, r.group)
		if err == nil {
			last = a
			if a.State == "Stable" && a.Members == len(r.Replicas) && a.Idle == 0 && len(a.Unassigned) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("group not balanced over %d replicas within 2 minutes: %+v (%v)", len(r.Replicas), last, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitCommitting waits (up to two minutes) until Prometheus has seen the
// committed offset of every partition move within the last window: after
// a restart, the next fault starts from a group that commits everywhere,
// not from partitions still stood still by the restart.
func (r *Rig) WaitCommitting(ctx context.Context, window time.Duration) error {
	expr := fmt.Sprintf(`count(max by (partition) (changes(billing_kafka_committed_offset{job="billing-consumer"}[%s])) > 0)`,
		model.Duration(window))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		v, err := r.Prom.Query(ctx, expr)
		if err == nil && len(v) == 1 && int(v[0].Value) == r.cfg.Partitions {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every partition committed in the last %v for 2 minutes: %s (%v)", window, show(v), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (rep *Replica) Kill() {
	if p := rep.process(); p != nil {
		_ = syscall.Kill(p.Pid(), syscall.SIGCONT) // a stopped process dies only once continued
		p.Kill()
	}
}

// Freeze stops the process (SIGSTOP): it holds its partitions, answers no
// scrape and commits nothing until Thaw.
func (rep *Replica) Freeze() error { return rep.signal(syscall.SIGSTOP) }

// Thaw continues a frozen process (SIGCONT).
func (rep *Replica) Thaw() error { return rep.signal(syscall.SIGCONT) }

func (rep *Replica) signal(s syscall.Signal) error {
	p := rep.process()
	if p == nil {
		return errors.New(rep.Pod + " not running")
	}
	return syscall.Kill(p.Pid(), s)
}

// SetDatabaseDown takes Postgres away from the replicas (down: every open
// connection is cut and new ones are refused, as when the server or the
// network to it is gone) or gives it back.
func (r *Rig) SetDatabaseDown(down bool) { r.pg.SetDown(down) }

// Produce starts sending cfg.OrdersPerSecond valid orders, each a new
// order, in five chunks a second, until StopProducing.
func (r *Rig) Produce() error {
	if r.stopProducing != nil {
		return errors.New("already producing")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopProducing = cancel
	perChunk := max(1, r.cfg.OrdersPerSecond/5)
	r.producing.Go(func() {
		for ctx.Err() == nil {
			plan, err := harness.Generate(harness.Spec{Orders: perChunk * 5 * 60, FirstOrderID: r.firstOrder,
				Seed: uint64(r.firstOrder), Now: time.Now()})
			if err != nil {
				return
			}
			r.firstOrder += int64(len(plan.Charged))
			_ = harness.Trickle(ctx, r.cfg.Brokers, r.topic, plan.Records, perChunk, 200*time.Millisecond)
		}
	})
	return nil
}

// StopProducing stops the traffic Produce started and waits for it.
func (r *Rig) StopProducing() {
	if r.stopProducing != nil {
		r.stopProducing()
		r.producing.Wait()
		r.stopProducing = nil
	}
}

// Close stops the traffic, the replicas (SIGTERM), Prometheus, the proxy
// and the simulator.
func (r *Rig) Close() {
	r.StopProducing()
	for _, rep := range r.Replicas {
		if p := rep.process(); p != nil {
			_ = rep.Thaw()
			if err := p.Stop(30 * time.Second); err != nil {
				p.Kill()
			}
		}
	}
	if r.Prom != nil {
		r.Prom.Stop()
	}
	if r.pg != nil {
		r.pg.Close()
	}
	if r.sim != nil {
		r.sim.Close()
	}
}
