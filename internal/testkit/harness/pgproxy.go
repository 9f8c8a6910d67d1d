package harness

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// PGProxy is a TCP proxy in front of Postgres for fault tests. The
// binaries under test connect through it (their BILLING_DATABASE_URL names
// its address, see URL), and the test cuts live connections on demand, as
// a failover, a pgbouncer restart or a broken network path would: a cut
// closes both sides at once, the client's with a TCP reset, so the client
// sees its connection die mid-transaction and the server rolls back
// whatever that connection had not committed. New connections are always
// accepted, unless the proxy is set down (SetDown). A Tap (SetTap) can cut a connection just before a given
// statement reaches the server. All methods are safe for concurrent use.
type PGProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	rng   *rand.Rand
	links map[*link]struct{}
	cuts  int
	tap   Tap // see SetTap
	down  atomic.Bool
}

// link is one proxied connection: the client's side and the server's.
type link struct {
	client, server net.Conn
	opened         time.Time
}

// StartPGProxy listens on a free loopback port and forwards every
// connection to target (host:port). seed makes CutShare's choices
// reproducible. Close stops it.
func StartPGProxy(target string, seed uint64) (*PGProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pg proxy: %w", err)
	}
	p := &PGProxy{ln: ln, target: target, rng: rand.New(rand.NewPCG(seed, 11)), links: map[*link]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *PGProxy) Addr() string { return p.ln.Addr().String() }

// URL returns dbURL (a postgres:// URL of the proxied server) with its host
// and port replaced by the proxy's.
func (p *PGProxy) URL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("pg proxy: database URL: %w", err)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

func (p *PGProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close() // Postgres down: the client sees a refused or closed connection
			continue
		}
		l := &link{client: c, server: s, opened: time.Now()}
		p.mu.Lock()
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() {
			var pipes sync.WaitGroup
			pipes.Go(func() { p.forwardClient(l); s.Close() })
			pipes.Go(func() { _, _ = io.Copy(c, s); c.Close() })
			pipes.Wait()
			p.mu.Lock()
			delete(p.links, l)
			p.mu.Unlock()
		})
	}
}

// Live returns the number of open proxied connections.
func (p *PGProxy) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// CutShare cuts each open connection older than spare with probability
// share (1 cuts them all) and returns how many it cut. Sparing young
// connections keeps a cut off a process's startup, whose first connection
// failing may end it (a crash loop, not a billing step).
func (p *PGProxy) CutShare(share float64, spare time.Duration) int {
	p.mu.Lock()
	var doomed []*link
	for l := range p.links {
		if time.Since(l.opened) < spare {
			continue
		}
		if share >= 1 || p.rng.Float64() < share {
			doomed = append(doomed, l)
			delete(p.links, l)
		}
	}
	p.cuts += len(doomed)
	p.mu.Unlock()
	for _, l := range doomed {
		reset(l)
	}
	return len(doomed)
}

// SetDown makes Postgres unreachable through the proxy (down: every open
// connection is cut, new ones are reset as soon as accepted, as when the
// server or the network to it is gone) or reachable again.
func (p *PGProxy) SetDown(down bool) {
	p.down.Store(down)
	if down {
		p.CutShare(1, 0)
	}
}

// Cuts returns how many connections CutShare and the Tap have cut so far.
func (p *PGProxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Close stops accepting, cuts every open connection and waits for the
// proxy's goroutines.
func (p *PGProxy) Close() error {
	err := p.ln.Close()
	p.CutShare(1, 0)
	p.wg.Wait()
	return err
}
