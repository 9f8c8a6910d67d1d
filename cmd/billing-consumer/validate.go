package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/payment"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
)

// validate checks the settings a command uses and returns every problem:
// each starts with the variable to fix ("BILLING_X: ..."), so that
// configFor can show them all on one line and one restart shows all that
// is wrong.
func (c config) validate(n need) []string {
	var errs []string
	told := map[string]bool{} // the variables with a problem
	v := func(name, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if name != "" {
			msg = fmt.Sprintf("%s_%s: %s", envPrefix, name, msg)
			told[name] = true
		}
		errs = append(errs, msg)
	}
	if !n.withoutDB {
		c.validateDatabaseURL(v)
	}
	if c.DBMaxConns < 0 {
		v("DB_MAX_CONNS", "must be 0 (automatic) or positive, got %d", c.DBMaxConns)
	}
	if c.BatchSize < 1 || c.BatchSize > 1000 {
		v("BATCH_SIZE", "must be between 1 and 1000, got %d", c.BatchSize)
	}
	if c.DBMaxConns > 0 && c.DBMaxConns <= reservedConns {
		v("DB_MAX_CONNS", "must be above %d (connections kept for maintenance and readiness), got %d", reservedConns, c.DBMaxConns)
	}
	if c.Concurrency < 1 || c.Concurrency > 4096 {
		v("CONCURRENCY", "must be between 1 and 4096, got %d", c.Concurrency)
	}
	if c.DedupRetention < 24*time.Hour {
		v("DEDUP_RETENTION", "must be at least 24h (a redelivery may come a day late), got %s", c.DedupRetention)
	}
	if c.DedupPartitionsAhead < 2 || c.DedupPartitionsAhead > 60 {
		v("DEDUP_PARTITIONS_AHEAD", "must be between 2 and 60, got %d", c.DedupPartitionsAhead)
	}
	if c.DedupLockTimeout <= 0 {
		v("DEDUP_LOCK_TIMEOUT", "must be positive, got %s", c.DedupLockTimeout)
	}
	if c.RetentionInterval < time.Minute {
		v("RETENTION_INTERVAL", "must be at least 1m, got %s", c.RetentionInterval)
	}
	if _, err := c.logLevel(); err != nil {
		v("LOG_LEVEL", "%v", err)
	}
	if c.BatchLinger < 0 || c.BatchLinger > time.Second {
		v("BATCH_LINGER", "must be between 0s and 1s, got %s", c.BatchLinger)
	}
	if c.DBTimeout < 100*time.Millisecond {
		v("DB_TIMEOUT", "must be at least 100ms, got %s", c.DBTimeout)
	}
	if c.CompleterInterval < 100*time.Millisecond {
		v("COMPLETER_INTERVAL", "must be at least 100ms, got %s", c.CompleterInterval)
	}
	report(v, told, "completer", completer(c, nil, nil, nil, "", "", nil).Validate())
	if c.ProviderMaxProcessing <= 0 {
		v("PROVIDER_MAX_PROCESSING", "must be positive, got %s", c.ProviderMaxProcessing)
	}
	if c.StartupBackoffMax < time.Second || c.StartupBackoffMax > 10*time.Minute {
		v("STARTUP_BACKOFF_MAX", "must be between 1s and 10m, got %s", c.StartupBackoffMax)
	}
	if c.PprofAddr != "" {
		if _, _, err := net.SplitHostPort(c.PprofAddr); err != nil || c.PprofAddr == c.HTTPAddr {
			v("PPROF_ADDR", "must be a host:port other than BILLING_HTTP_ADDR, got %q", c.PprofAddr)
		}
	}
	if n.kafka {
		c.validateKafka(v, told)
		c.validateDLQ(v)
	}
	if n.payment {
		c.validatePayment(v)
		report(v, told, "pipeline", c.pipelineConfig().Validate())
	}
	if n.consume {
		c.validateBudget(v, told)
	}
	return errs
}

// problem records one configuration error about BILLING_<name>; an empty
// name means the message names its variables itself.
type problem func(name, format string, args ...any)

// validateKafka checks the Kafka settings: cmd's own rules first (the
// brokers' host:port, the topic names, the session timeout of at least
// 1s), then the consumer's (consumer.Config.Validate: the brokers, topic
// and group required, the heartbeat and the drain against the session
// and rebalance timeouts), then the shutdown and the watchers' intervals.
func (c config) validateKafka(v problem, told map[string]bool) {
	for _, b := range c.KafkaBrokers {
		host, port, err := net.SplitHostPort(b)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
			v("KAFKA_BROKERS", "%q is not host:port", b)
			break
		}
	}
	for _, nt := range [][2]string{{"KAFKA_TOPIC", c.KafkaTopic}, {"KAFKA_DLQ_TOPIC", c.KafkaDLQTopic}} {
		name, topic := nt[0], nt[1]
		if topic == "" || len(topic) > 249 || strings.Trim(topic, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
			v(name, "%q is not a valid topic name", topic)
		}
	}
	if c.KafkaTopic == c.KafkaDLQTopic && c.KafkaTopic != "" {
		v("KAFKA_DLQ_TOPIC", "must differ from BILLING_KAFKA_TOPIC")
	}
	if c.KafkaCommitInterval < 0 || c.KafkaCommitInterval > time.Minute {
		v("KAFKA_COMMIT_INTERVAL", "must be between 0s and 1m, got %s", c.KafkaCommitInterval)
	}
	if c.KafkaSessionTimeout < time.Second {
		v("KAFKA_SESSION_TIMEOUT", "must be at least 1s (brokers also enforce group.min.session.timeout.ms, 6s by default), got %s", c.KafkaSessionTimeout)
	}
	report(v, told, "consumer", c.consumerConfig().Validate(), "Brokers", "Topic", "GroupID", "HeartbeatInterval", "DrainTimeout")
	if c.ShutdownTimeout <= c.DrainTimeout {
		v("SHUTDOWN_TIMEOUT", "must exceed BILLING_DRAIN_TIMEOUT (%s), got %s", c.DrainTimeout, c.ShutdownTimeout)
	}
	if c.KafkaLagInterval < time.Second {
		v("KAFKA_LAG_INTERVAL", "must be at least 1s, got %s", c.KafkaLagInterval)
	}
	if c.DLQBacklogInterval < time.Second {
		v("DLQ_BACKLOG_INTERVAL", "must be at least 1s, got %s", c.DLQBacklogInterval)
	}
	c.validateKafkaSecurity(v)
}

func (c config) validatePayment(v problem) {
	u, err := url.Parse(c.PaymentURL)
	if c.PaymentURL == "" {
		v("PAYMENT_URL", "required")
	} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v("PAYMENT_URL", "must be an absolute http or https URL")
	}
	if c.PaymentTimeout <= 0 {
		v("PAYMENT_TIMEOUT", "must be positive, got %s", c.PaymentTimeout)
	}
	c.validatePaymentClient(v, u)
	if c.MaxAttempts < 1 || c.MaxAttempts > 100 {
		v("MAX_ATTEMPTS", "must be between 1 and 100, got %d", c.MaxAttempts)
	}
	if c.OutageThreshold < 0 || c.OutageThreshold > 10000 {
		v("OUTAGE_THRESHOLD", "must be between 0 and 10000, got %d", c.OutageThreshold)
	}
	if c.PaymentCAFile != "" && (u == nil || u.Scheme != "https") {
		v("PAYMENT_CA_FILE", "set, but BILLING_PAYMENT_URL is not https")
	}
	readable(v, "PAYMENT_CA_FILE", c.PaymentCAFile)
	if c.CompleterAfter > 0 && c.CompleterAfter <= c.PaymentTimeout {
		v("COMPLETER_AFTER", "must be above BILLING_PAYMENT_TIMEOUT (%s), got %s", c.PaymentTimeout, c.CompleterAfter)
	}
	// The budget must outlast the outage detection: an event failing alone
	// at low traffic must be seen as an outage, and pause, before it can be
	// exhausted.
	if c.RetryBudget < 0 || c.RetryBudget > 24*time.Hour {
		v("RETRY_BUDGET", "must be between 0s and 24h, got %s", c.RetryBudget)
	}
	if c.OutageAfter < 0 || c.OutageAfter > time.Hour {
		v("OUTAGE_AFTER", "must be between 0s and 1h, got %s", c.OutageAfter)
	}
	// Parking must wait out the outage detection by time, or an event
	// failing alone at low traffic (an outage) is parked before the outage
	// is seen; and it must come before the budget ends.
	if c.ParkAfter != 0 && (c.ParkAfter <= c.PaymentTimeout || c.ParkAfter < c.OutageAfter || c.RetryBudget > 0 && c.ParkAfter >= c.RetryBudget) {
		v("PARK_AFTER", "must be 0 (never park), or above BILLING_PAYMENT_TIMEOUT (%s), at least BILLING_OUTAGE_AFTER (%s) and below BILLING_RETRY_BUDGET (%s), got %s",
			c.PaymentTimeout, c.OutageAfter, c.RetryBudget, c.ParkAfter)
	}
	if c.RetryBudget > 0 && c.OutageAfter > 0 && c.RetryBudget <= c.OutageAfter {
		v("RETRY_BUDGET", "must exceed BILLING_OUTAGE_AFTER (%s), or an event failing alone is exhausted before the outage is seen, got %s",
			c.OutageAfter, c.RetryBudget)
	}
}

func (c config) validateDLQ(v problem) {
	if c.DLQMaxReplays < 1 || c.DLQMaxReplays > 100 {
		v("DLQ_MAX_REPLAYS", "must be between 1 and 100, got %d", c.DLQMaxReplays)
	}
	// Joining the consumers' group with another topic would rebalance
	// them, and replay would commit as if it were billing.
	if c.dlqReplayGroup() == c.KafkaGroupID {
		v("DLQ_REPLAY_GROUP_ID", "must differ from BILLING_KAFKA_GROUP_ID")
	}
}

// validateDatabaseURL checks BILLING_DATABASE_URL as pgx will read it and
// names what is wrong (a parameter such as sslmode, the port, the syntax),
// never the value: the string may hold a password.
func (c config) validateDatabaseURL(v problem) {
	u := c.DatabaseURL
	switch {
	case u == "":
		v("DATABASE_URL", "required (or BILLING_DATABASE_URL_FILE)")
		return
	case !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") && !strings.Contains(u, "="):
		v("DATABASE_URL", "not a postgres:// URL or key=value connection string")
		return
	}
	if err := postgres.ValidateURL(u); err != nil {
		v("DATABASE_URL", "%s", err)
	}
}

// readable reports the file of BILLING_<name> when it is set and cannot be
// read, with its path: a missing mount shows up with every other problem,
// not alone at the next start. What the file holds is checked where it is
// used (kafkaConns, paymentTLS).
func readable(v problem, name, path string) {
	if path == "" {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		v(name, "cannot read %s: %v", path, errors.Unwrap(err))
		return
	}
	_ = f.Close()
}

// validatePaymentClient checks BILLING_PAYMENT_CLIENT; u is the parsed
// BILLING_PAYMENT_URL (nil when it does not parse). The fasthttp client
// dials the provider directly, so a proxy the environment selects for the
// URL (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) stops startup rather than being
// bypassed.
func (c config) validatePaymentClient(v problem, u *url.URL) {
	switch c.PaymentClient {
	case string(payment.NetHTTP):
	case string(payment.FastHTTP):
		if u == nil || u.Host == "" {
			return
		}
		if p, err := http.ProxyFromEnvironment(&http.Request{URL: u}); err != nil || p != nil {
			v("PAYMENT_CLIENT", "fasthttp cannot use the proxy that HTTPS_PROXY/HTTP_PROXY select for BILLING_PAYMENT_URL; use nethttp, or exempt the provider in NO_PROXY")
		}
	default:
		v("PAYMENT_CLIENT", "must be nethttp or fasthttp, got %q", c.PaymentClient)
	}
}
