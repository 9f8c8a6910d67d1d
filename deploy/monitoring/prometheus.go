package monitoring

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// Target is one replica as the ServiceMonitor makes it a scrape target:
// its address and its pod's name.
type Target struct{ Addr, Pod string }

// ServerConfig configures a Prometheus server of the scenario.
type ServerConfig struct {
	// Bin is the prometheus binary (scripts/prometheus.sh path).
	Bin string
	// Dir holds the configuration, the rules and the TSDB; it must exist.
	Dir string
	// Addr is the listen address, e.g. 127.0.0.1:9091.
	Addr string
	// Namespace and Job label every target's series, as the Prometheus
	// operator labels a ServiceMonitor's targets (plus pod).
	Namespace, Job string
	Targets        []Target
	// Interval is both the scrape and the rule evaluation interval.
	Interval time.Duration
	// Rules is a rule file (Scaled); empty loads none.
	Rules []byte
	// Log receives the server's output.
	Log io.Writer
}

// Server is a running Prometheus; API is its HTTP API.
type Server struct {
	URL  string
	API  promv1.API
	cmd  *exec.Cmd
	done chan error
}

type scrapeConfig struct {
	JobName        string         `json:"job_name"`
	ScrapeInterval string         `json:"scrape_interval"`
	ScrapeTimeout  string         `json:"scrape_timeout"`
	StaticConfigs  []staticConfig `json:"static_configs"`
}

type staticConfig struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// config is prometheus.yml for c.
func (c ServerConfig) config() ([]byte, error) {
	iv := model.Duration(c.Interval).String()
	sc := scrapeConfig{JobName: c.Job, ScrapeInterval: iv, ScrapeTimeout: iv}
	for _, t := range c.Targets {
		sc.StaticConfigs = append(sc.StaticConfigs, staticConfig{Targets: []string{t.Addr},
			Labels: map[string]string{"namespace": c.Namespace, "pod": t.Pod}})
	}
	cfg := map[string]any{
		"global":         map[string]any{"scrape_interval": iv, "evaluation_interval": iv},
		"scrape_configs": []scrapeConfig{sc},
	}
	if len(c.Rules) > 0 {
		cfg["rule_files"] = []string{filepath.Join(c.Dir, "rules.yml")}
	}
	return yaml.Marshal(cfg)
}

// StartServer writes the configuration into c.Dir, starts Prometheus and
// waits until it is ready (at most a minute). Stop ends it.
func StartServer(ctx context.Context, c ServerConfig) (*Server, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "prometheus.yml"), cfg, 0o644); err != nil {
		return nil, err
	}
	if len(c.Rules) > 0 {
		if err := os.WriteFile(filepath.Join(c.Dir, "rules.yml"), c.Rules, 0o644); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(c.Bin, "--config.file="+filepath.Join(c.Dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(c.Dir, "data"), "--web.listen-address="+c.Addr,
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = c.Log, c.Log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start prometheus: %w", err)
	}
	s := &Server{URL: "http://" + c.Addr, cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	client, err := api.NewClient(api.Config{Address: s.URL})
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.API = promv1.NewAPI(client)
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		resp, err := http.Get(s.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("prometheus exited at startup: %v", err)
		case <-ctx.Done():
			return errors.New("prometheus not ready within a minute")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop ends the server (SIGTERM, then SIGKILL after 10s) and waits for it.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-s.done:
		s.done <- err
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		s.done <- <-s.done
	}
}

// Alert is one firing alert: its name and the labels that tell its
// instances apart (partition, reason, pod), without the common ones.
type Alert struct {
	Name   string
	Labels string
}

func (a Alert) String() string {
	if a.Labels == "" {
		return a.Name
	}
	return a.Name + "{" + a.Labels + "}"
}

// distinguishing are the labels that tell instances of one alert apart in
// this scenario.
var distinguishing = []string{"partition", "reason", "pod"}

// Firing returns the alerts Prometheus reports as firing (not pending),
// sorted.
func (s *Server) Firing(ctx context.Context) ([]Alert, error) {
	res, err := s.API.Alerts(ctx)
	if err != nil {
		return nil, fmt.Errorf("prometheus alerts: %w", err)
	}
	var out []Alert
	for _, a := range res.Alerts {
		if a.State != promv1.AlertStateFiring {
			continue
		}
		var ls []string
		for _, l := range distinguishing {
			if v, ok := a.Labels[model.LabelName(l)]; ok {
				ls = append(ls, l+"="+string(v))
			}
		}
		out = append(out, Alert{Name: string(a.Labels[model.AlertNameLabel]), Labels: strings.Join(ls, ",")})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// Query evaluates expr now and returns its instant vector (a scalar
// result is returned as one series without labels).
func (s *Server) Query(ctx context.Context, expr string) (model.Vector, error) {
	v, _, _, err := s.API.Query(ctx, expr, time.Now())
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	switch v := v.(type) {
	case model.Vector:
		return v, nil
	case *model.Scalar:
		return model.Vector{{Value: v.Value, Timestamp: v.Timestamp}}, nil
	default:
		return nil, fmt.Errorf("query %s: result of type %s", expr, v.Type())
	}
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
