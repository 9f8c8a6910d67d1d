package e2e

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// services is a Postgres cluster and a Kafka broker of the chaos test's
// own, started through the project's scripts, so that restarting them does
// not disturb the tests running beside it.
type services struct {
	pgEnv, kafkaEnv []string
	adminURL        string
	brokers         []string
}

func startServices(t *testing.T) *services {
	t.Helper()
	// Not t.TempDir: Postgres runs as its own user, which must reach the
	// directory.
	dir, err := os.MkdirTemp("", "billing-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &services{
		pgEnv: []string{"PG_DIR=" + dir + "/pg", "PG_PORT=" + freePort(t)},
		kafkaEnv: []string{"KAFKA_DIR=" + dir + "/kafka", "KAFKA_PORT=" + freePort(t),
			"KAFKA_CONTROLLER_PORT=" + freePort(t)},
	}
	s.adminURL = strings.TrimSpace(s.script(t, s.pgEnv, "pg.sh", "start"))
	s.brokers = []string{strings.TrimSpace(s.script(t, s.kafkaEnv, "kafka.sh", "start"))}
	t.Cleanup(func() {
		_, _ = s.try(s.kafkaEnv, "kafka.sh", "stop")
		_, _ = s.try(s.pgEnv, "pg.sh", "stop")
	})
	return s
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	_, port, err := net.SplitHostPort(kafkatest.FreePort(t))
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func (s *services) try(env []string, script string, args ...string) (string, error) {
	cmd := exec.Command("../scripts/"+script, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/%s %s: %v\n%s", script, strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func (s *services) script(t *testing.T, env []string, script string, args ...string) string {
	t.Helper()
	out, err := s.try(env, script, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// cutProxy forwards TCP to the provider and can cut the network: while cut,
// it refuses new connections and has dropped the open ones.
type cutProxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() { ln.Close(); p.setCut(true); p.wg.Wait() })
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c, up)
		p.wg.Go(func() { io.Copy(up, c); up.Close() })
		p.wg.Go(func() { io.Copy(c, up); c.Close() })
	}
}

func (p *cutProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.cut.Store(cut)
	if !cut {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}
