package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/billing-consumer/billing-consumer/internal/billing"
)

// envPrefix is the prefix of every variable billing-consumer reads.
const envPrefix = "BILLING"

// config is every setting of billing-consumer, read from BILLING_*
// variables by envconfig. Names come from split_words: an explicit
// envconfig:"NAME" tag would make envconfig fall back to the bare,
// unprefixed NAME (a DATABASE_URL meant for another program) when the
// BILLING_ one is unset. The desc tags are the help text; "secret" marks
// values that never appear in an error or log line and that may also be
// given as a file named by <VARIABLE>_FILE.
type config struct {
	KafkaBrokers  []string `split_words:"true" desc:"comma-separated host:port list of Kafka bootstrap brokers (required by run and dlq)"`
	KafkaTopic    string   `split_words:"true" default:"order-service.order.confirmed" desc:"source topic of order.confirmed events"`
	KafkaGroupID  string   `split_words:"true" default:"billing-order-confirmed" desc:"consumer group; also the consumer_group column of processed_event"`
	KafkaDLQTopic string   `split_words:"true" default:"billing-order-confirmed.dlq" desc:"dead-letter topic"`

	DLQReplayGroupID string `split_words:"true" desc:"consumer group of dlq replay on the dead-letter topic; its committed offsets let the next replay resume (empty: BILLING_KAFKA_GROUP_ID plus .dlq-replay)"`
	DLQMaxReplays    int    `split_words:"true" default:"3" desc:"dlq replay refuses, and stops at, a record already replayed this many times (its dlq-replay-count header)"`

	DatabaseURL     string        `split_words:"true" secret:"true" desc:"pgx connection string, e.g. postgres://user:pass@host:5432/db?sslmode=verify-full (required; or BILLING_DATABASE_URL_FILE)"`
	DatabaseURLFile string        `split_words:"true" desc:"file holding BILLING_DATABASE_URL (a mounted secret)"`
	DBMaxConns      int32         `split_words:"true" default:"0" desc:"Postgres pool size; each in-flight transaction (one event, or a batch) holds a connection during its charges. 0: min(BILLING_CONCURRENCY, 28)+4, or BILLING_CONCURRENCY+4 without batching"`
	BatchSize       int           `split_words:"true" default:"128" desc:"most events billed in one transaction (one commit, charges in parallel); events arriving together are batched while the connections are busy. 1 is one transaction per event"`
	BatchLinger     time.Duration `split_words:"true" default:"2ms" desc:"under load (a batch in flight, or the last event less than this ago) how long a batch may wait to fill before it is billed (fewer commits per event); an idle service bills at once, and with BILLING_CONCURRENCY=1 nothing waits. 0: never wait"`

	PaymentURL       string        `split_words:"true" desc:"base URL of the payment provider; charges go to {url}/payments/charge (required by run)"`
	PaymentToken     string        `split_words:"true" secret:"true" desc:"bearer token for the payment provider (optional; or BILLING_PAYMENT_TOKEN_FILE)"`
	PaymentTokenFile string        `split_words:"true" desc:"file holding BILLING_PAYMENT_TOKEN (a mounted secret)"`
	PaymentTimeout   time.Duration `split_words:"true" default:"10s" desc:"timeout of one payment request, body included"`
	PaymentClient    string        `split_words:"true" default:"nethttp" desc:"HTTP client library of the payment calls: nethttp (net/http: HTTP/1.1 or HTTP/2, honours HTTPS_PROXY) or fasthttp (HTTP/1.1 only, less CPU per charge, no proxy); both make one attempt per charge, never re-send it on their own, and classify answers alike"`

	Concurrency            int           `split_words:"true" default:"1024" desc:"events processed at once by this instance, across partitions; events with the same record key always run one at a time, in order. 1 with BILLING_KAFKA_COMMIT_INTERVAL=0 is the sequential mode"`
	MaxInflightBytes       int64         `split_words:"true" default:"0" desc:"bytes all partitions together may hold between fetch and commit (each record its key, value and headers plus 512); a partition whose next record does not fit stops fetching until records complete, each partition keeps a fair share. 0: a thirty-second of the memory limit (GOMEMLIMIT, else the cgroup's; 8MiB without one). At least one maximal record, at most a quarter of the memory limit (the heap it costs is about twice the budget)"`
	KafkaMaxRecordBytes    int           `split_words:"true" default:"1048576" desc:"largest record expected (Kafka's default limit, 1MiB), and the most one fetch of a partition asks for (less with many partitions: the budget's share of each); a larger record is still consumed, counted as this large"`
	KafkaCommitInterval    time.Duration `split_words:"true" default:"1s" desc:"commit offsets (the finished prefix of each partition) on this interval, and on revoke and shutdown; 0 commits after every event"`
	KafkaSessionTimeout    time.Duration `split_words:"true" default:"6s" desc:"consumer group session timeout: a crashed replica's partitions stand still this long (plus about a second) before the group hands them to another; every rebalance pauses all replicas (kafka-go's eager protocol). Shorter recovers faster but must outlast a drain (no heartbeat while draining) and a stalled process; brokers refuse less than group.min.session.timeout.ms (6s by default)"`
	KafkaHeartbeatInterval time.Duration `split_words:"true" default:"500ms" desc:"interval of the heartbeats that keep the session alive and discover a rebalance; below a third of BILLING_KAFKA_SESSION_TIMEOUT"`
	KafkaRebalanceTimeout  time.Duration `split_words:"true" default:"12s" desc:"how long the group waits for its live members to rejoin in a rebalance; must exceed BILLING_DRAIN_TIMEOUT (a member rejoins after its drain and final commit). kafka-go gives up on a join after this plus 5s"`
	KafkaLagInterval       time.Duration `split_words:"true" default:"15s" desc:"interval of the consumer-lag query to the brokers"`
	DrainTimeout           time.Duration `split_words:"true" default:"3s" desc:"how long in-flight events may finish after a rebalance or SIGTERM before they are abandoned (and redelivered; a charge cut off stays a pending claim that its redelivery settles); below the session and rebalance timeouts, with room for a heartbeat interval and the final commit: kafka-go does not heartbeat while a generation drains"`
	ShutdownTimeout        time.Duration `split_words:"true" default:"30s" desc:"bound of the whole graceful shutdown; keep the pod's terminationGracePeriodSeconds above it"`
	MaxAttempts            int           `split_words:"true" default:"8" desc:"least number of attempts of an event failing transiently (5xx, 409, 429, timeout) before it may be dead-lettered as exhausted; BILLING_RETRY_BUDGET must be spent too"`
	RetryBackoff           time.Duration `split_words:"true" default:"200ms" desc:"first delay between attempts; doubles each attempt, with 20% jitter"`
	RetryBackoffMax        time.Duration `split_words:"true" default:"10s" desc:"cap of the delay between attempts"`

	// The durable ledger claim (SPEC §6) and its completer.
	DBTimeout         time.Duration `split_words:"true" default:"10s" desc:"deadline of each database statement on the billing path: a connection that silently drops packets fails the attempt instead of hanging it"`
	CompleterInterval time.Duration `split_words:"true" default:"15s" desc:"how often the running service settles stale pending ledger claims (one replica at a time, by advisory lock)"`
	CompleterAfter    time.Duration `split_words:"true" default:"1m" desc:"age from which a pending ledger claim is settled by the completer, re-sending its stored request (same key, same body); above BILLING_PAYMENT_TIMEOUT"`
	ClaimBlockAfter   time.Duration `split_words:"true" default:"1h" desc:"a pending claim whose outcome is still unknown this long after it was made becomes blocked for an operator; keep it well below the provider's idempotency-key retention (24h at Stripe)"`
	// ProviderMaxProcessing bounds what the provider does after the client
	// gave up (SPEC §11 I5).
	ProviderMaxProcessing time.Duration `split_words:"true" default:"5m" desc:"how long the provider may still finish a charge request after the client gave up on it (its own processing bound; ask the provider). Every send records its deadline (BILLING_PAYMENT_TIMEOUT plus BILLING_DB_TIMEOUT after the record, nothing sent later) plus this bound in the ledger, and claim release and claim mark-charged refuse until then"`

	OutageThreshold int `split_words:"true" default:"10" desc:"distinct events failing transiently in a row (no success between) that mean the provider or database is down: the service then pauses instead of dead-lettering; 0 disables"`

	// Retry budget and outage detection by time (validated in validatePayment).
	RetryBudget time.Duration `split_words:"true" default:"30m" desc:"how long the provider must have failed an event, while others succeed (time paused in an outage or waiting for another event's claim not counted), before it is dead-lettered as exhausted; 0: BILLING_MAX_ATTEMPTS alone decides. Must exceed BILLING_OUTAGE_AFTER"`
	OutageAfter time.Duration `split_words:"true" default:"30s" desc:"how long transient failures may go on with no success at all before they mean the provider or database is down (however few events fail, e.g. at low traffic): the service then pauses instead of dead-lettering; 0 disables"`
	ParkAfter   time.Duration `split_words:"true" default:"30s" desc:"an event failing transiently this long while the provider succeeds for others is parked: its record is committed and the completer re-sends its claim's request (same key, same body) on a backoff from 1s, so one order's trouble does not hold its partition; an event waiting this long on another event's unsettled claim for its order is deferred (stored, its record committed, decided once that claim settles); above BILLING_PAYMENT_TIMEOUT, at least BILLING_OUTAGE_AFTER and below BILLING_RETRY_BUDGET; 0: never park nor defer"`

	HTTPAddr string `split_words:"true" default:":9090" desc:"listen address of /metrics, /healthz and /readyz"`

	DedupRetention       time.Duration `split_words:"true" default:"168h" desc:"how long processed_event rows are kept; older day partitions are dropped"`
	DedupPartitionsAhead int           `split_words:"true" default:"3" desc:"days of processed_event partitions created ahead of today (at least 2)"`
	DedupLockTimeout     time.Duration `split_words:"true" default:"2s" desc:"how long a partition CREATE or DROP may wait for its table lock before the pass gives up"`
	RetentionInterval    time.Duration `split_words:"true" default:"1h" desc:"interval of the running consumer's partition maintenance"`

	LogLevel string `split_words:"true" default:"info" desc:"debug, info, warn or error"`

	PprofAddr          string        `split_words:"true" desc:"listen address of net/http/pprof (/debug/pprof/), e.g. 127.0.0.1:6060; empty: off. Never the metrics port"`
	StartupBackoffMax  time.Duration `split_words:"true" default:"30s" desc:"cap of the delay between two attempts to reach Postgres or Kafka while run waits for them at startup (unready)"`
	DLQBacklogInterval time.Duration `split_words:"true" default:"1m" desc:"interval of the query of the dead-letter backlog (billing_dlq_records, billing_dlq_oldest_record_age_seconds)"`

	// Transport security (security.go). KafkaTLSCaFile is spelled so for
	// split_words: "KafkaTLSCAFile" would become KAFKA_TLSCA_FILE.
	KafkaTLS              bool   `split_words:"true" default:"false" desc:"connect to the brokers with TLS (1.2 or later, certificates always verified); needed by every other BILLING_KAFKA_TLS_ variable"`
	KafkaTLSCaFile        string `split_words:"true" desc:"PEM file of the CA certificates that sign the brokers' certificates (empty: the system roots)"`
	KafkaTLSCertFile      string `split_words:"true" desc:"PEM client certificate (chain), for brokers that authenticate clients by certificate; with BILLING_KAFKA_TLS_KEY_FILE"`
	KafkaTLSKeyFile       string `split_words:"true" desc:"PEM private key (unencrypted) of BILLING_KAFKA_TLS_CERT_FILE"`
	KafkaTLSServerName    string `split_words:"true" desc:"name verified in every broker's certificate (empty: the host of the address dialled)"`
	KafkaSASLMechanism    string `split_words:"true" default:"none" desc:"SASL mechanism: none, plain (requires BILLING_KAFKA_TLS), scram-sha-256 or scram-sha-512"`
	KafkaSASLUsername     string `split_words:"true" desc:"SASL user name (required with a mechanism)"`
	KafkaSASLPassword     string `split_words:"true" secret:"true" desc:"SASL password (required with a mechanism; or BILLING_KAFKA_SASL_PASSWORD_FILE)"`
	KafkaSASLPasswordFile string `split_words:"true" desc:"file holding BILLING_KAFKA_SASL_PASSWORD (a mounted secret)"`
	PaymentCAFile         string `split_words:"true" desc:"PEM file of the CA certificates trusted for an https BILLING_PAYMENT_URL, instead of the system roots"`
}

// configFor reads the configuration and validates it for a command. Every
// problem is reported at once, on one line, each starting with the
// variable to fix: unknown BILLING_* variables (with the nearest known
// name), values that do not parse, secrets given twice or in unreadable
// files, and whatever validate finds in the rest. A variable that did not
// parse is checked as if it held its default, and its own problem is told
// once. No message holds a secret's value.
func configFor(n need) (config, error) {
	problems := unknownVariables(environ())
	c, reported := readConfig(&problems)
	c.resolveSecrets(&problems, reported)
	for _, p := range c.validate(n) {
		if name, _, _ := strings.Cut(p, ":"); !reported[name] {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return c, errors.New(strings.Join(problems, "; "))
	}
	return c, nil
}

// defaultsPrefix is a prefix no one sets: processing the config struct with
// it yields the defaults of its tags.
const defaultsPrefix = "BILLING_CONFIG_DEFAULTS_ONLY"

// readConfig reads each field of config on its own (envconfig.Process
// stops at the first value it cannot parse), with the field's own tags, so
// the same variable name. A field that does not parse gets its default and
// its variable goes into reported, with the problem appended to problems.
func readConfig(problems *[]string) (config, map[string]bool) {
	var c, def config
	if err := envconfig.Process(defaultsPrefix, &def); err != nil {
		panic(fmt.Sprintf("config defaults: %v", err)) // a programmer error in the tags
	}
	reported := map[string]bool{}
	cv, dv := reflect.ValueOf(&c).Elem(), reflect.ValueOf(def)
	t := cv.Type()
	for i := range t.NumField() {
		one := reflect.New(reflect.StructOf([]reflect.StructField{t.Field(i)}))
		var pe *envconfig.ParseError
		switch err := envconfig.Process(envPrefix, one.Interface()); {
		case errors.As(err, &pe):
			*problems = append(*problems, fmt.Sprintf("%s: cannot parse %q as %s", pe.KeyName, pe.Value, pe.TypeName))
			reported[pe.KeyName] = true
			cv.Field(i).Set(dv.Field(i))
		case err != nil:
			panic(fmt.Sprintf("config field %s: %v", t.Field(i).Name, err))
		default:
			cv.Field(i).Set(one.Elem().Field(0))
		}
	}
	// The same list is validated and used: no stray spaces. An empty entry
	// stays, for validate to reject.
	for i, b := range c.KafkaBrokers {
		c.KafkaBrokers[i] = strings.TrimSpace(b)
	}
	return c, reported
}

// resolveSecrets replaces each secret given as a file by the file's
// trimmed content. A secret given twice, or a file that cannot be read, is
// a problem of its own; the secret's variable then goes into reported, so
// that validate's "required" does not contradict it.
func (c *config) resolveSecrets(problems *[]string, reported map[string]bool) {
	for _, sec := range []struct {
		name        string
		value, file *string
	}{
		{"DATABASE_URL", &c.DatabaseURL, &c.DatabaseURLFile},
		{"PAYMENT_TOKEN", &c.PaymentToken, &c.PaymentTokenFile},
		{"KAFKA_SASL_PASSWORD", &c.KafkaSASLPassword, &c.KafkaSASLPasswordFile},
	} {
		v, err := secret(sec.name, *sec.value, *sec.file)
		if err != nil {
			*problems = append(*problems, err.Error())
			reported[envPrefix+"_"+sec.name] = true
			continue
		}
		*sec.value = v
	}
}

// secret returns value, or the trimmed content of file when file is set.
// Its errors name the variables and the file's path, never the value.
func secret(name, value, file string) (string, error) {
	if file == "" {
		return value, nil
	}
	if value != "" {
		return "", fmt.Errorf("%s_%s and %s_%s_FILE are both set; set one", envPrefix, name, envPrefix, name)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s_%s_FILE: cannot read %s: %w", envPrefix, name, file, errors.Unwrap(err))
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s_%s_FILE: file %s is empty", envPrefix, name, file)
	}
	return s, nil
}

// need says which settings a command requires. The database is required
// unless withoutDB says otherwise (dlq replay): the zero value stays safe.
// consume is run's: the consumer's in-flight budget, checked against this
// process's memory limit (a CronJob with a smaller pod shares the
// ConfigMap, and does not consume).
type need struct{ kafka, payment, withoutDB, consume bool }

// dbMaxConns is the pool size: BILLING_DB_MAX_CONNS, or when it is 0 enough
// for the billing transactions plus background work (maintenance,
// readiness). With batching, events beyond the connections wait in bigger
// batches rather than for connections of their own.
func (c config) dbMaxConns() int32 {
	if c.DBMaxConns > 0 {
		return c.DBMaxConns
	}
	if c.BatchSize > 1 {
		return int32(min(c.Concurrency, 28)) + reservedConns
	}
	return int32(c.Concurrency) + reservedConns
}

// reservedConns are the pool's connections kept from billing.
const reservedConns = 4

// sends is how a sender on host records its sends (SPEC §11 I5). Its
// deadline D covers everything after the record: the charge transaction's
// statements before the request (one BILLING_DB_TIMEOUT for them all: a
// slower start leaves the request less time, never more) and the request
// (BILLING_PAYMENT_TIMEOUT).
func (c config) sends(host string) billing.SendConfig {
	return billing.SendConfig{Deadline: c.PaymentTimeout + c.DBTimeout, ProviderMaxProcessing: c.ProviderMaxProcessing, Host: host}
}

// hostname names a one-shot command's process in the ledger's records.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "billing-consumer"
	}
	return h
}

func (c config) logLevel() (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(c.LogLevel))
	return l, err
}

// printUsage writes the table of every variable: name, type, default and
// meaning, generated from the config struct so it cannot drift.
func printUsage(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	const format = `VARIABLE	TYPE	DEFAULT	MEANING
{{range .}}{{usage_key .}}	{{usage_type .}}	{{usage_default .}}	{{usage_description .}}
{{end}}`
	if err := envconfig.Usagef(envPrefix, &config{}, tw, format); err != nil {
		return err
	}
	return tw.Flush()
}
