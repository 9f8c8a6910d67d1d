package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// profiler takes the profiles of -profile: a CPU profile of the consumer
// from its first committed-offset advance on (the steady state of the
// backlog drain), and its allocation profile at the end. The consumer
// serves them on BILLING_PPROF_ADDR (cmd/billing-consumer/ops.go). A nil
// *profiler does nothing.
type profiler struct {
	dir     string        // where cpu.pprof and allocs.pprof go
	seconds int           // length of the CPU profile
	addr    string        // the consumer's BILLING_PPROF_ADDR
	began   time.Time     // when the CPU profile was asked for
	done    chan error    // the CPU profile's outcome
	drained time.Duration // how long before the CPU profile's end the backlog was drained (0: it was not)
}

// newProfiler picks a free loopback port for the consumer's pprof listener.
func newProfiler(dir string, seconds int) (*profiler, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &profiler{dir: dir, seconds: seconds, addr: addr}, nil
}

// env is the consumer's setting that turns its pprof listener on.
func (p *profiler) env() []string {
	if p == nil {
		return nil
	}
	return []string{"BILLING_PPROF_ADDR=" + p.addr}
}

// start asks the consumer for a CPU profile of p.seconds, in the background.
func (p *profiler) start(ctx context.Context, _ *consumerProc) {
	if p == nil {
		return
	}
	p.began, p.done = time.Now(), make(chan error, 1)
	go func() {
		p.done <- p.fetch(ctx, fmt.Sprintf("profile?seconds=%d", p.seconds), "cpu.pprof")
	}()
}

// finish waits for the CPU profile, then takes the allocation profile
// (every allocation since the consumer started).
func (p *profiler) finish(ctx context.Context) error {
	if p == nil || p.done == nil {
		return nil
	}
	if left := time.Until(p.began.Add(time.Duration(p.seconds) * time.Second)); left > 0 {
		p.drained = left
	}
	if err := <-p.done; err != nil {
		return err
	}
	return p.fetch(ctx, "allocs", "allocs.pprof")
}

// fetch saves /debug/pprof/<path> of the consumer as file in p.dir.
func (p *profiler) fetch(ctx context.Context, path, file string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(p.seconds)*time.Second+time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/debug/pprof/"+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("pprof %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("pprof %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	f, err := os.Create(filepath.Join(p.dir, file))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("pprof %s: %w", path, err)
	}
	return f.Close()
}

// runProfile drains one backlog of the default mode at 0 ms under the
// profiler (the bench's own backlog phase, exactly-once verified), then
// prints the head of `go tool pprof -top` of both profiles.
func (b *bench) runProfile(ctx context.Context) error {
	def := modes[len(modes)-1]
	r := result{Mode: def.name, Latency: 0, Backlog: b.o.profileBacklog}
	fmt.Fprintf(b.out, "profile: default mode, 0 ms, %d records backlog, CPU profile of %d s from the first commit...\n", r.Backlog, b.prof.seconds)
	if err := b.backlogPhase(ctx, def, 0, &r); err != nil {
		return err
	}
	fmt.Fprintln(b.out, r.line())
	if b.prof.drained > 0 {
		fmt.Fprintf(b.out, "note: the backlog was drained %.1f s before the CPU profile ended, so the profile holds idle time: raise -profile-backlog\n",
			b.prof.drained.Seconds())
	}
	for _, t := range []struct{ file, index string }{{"cpu.pprof", ""}, {"allocs.pprof", "-sample_index=alloc_space"}} {
		path := filepath.Join(b.prof.dir, t.file)
		args := []string{"tool", "pprof", "-top", "-nodecount=25"}
		if t.index != "" {
			args = append(args, t.index)
		}
		out, err := exec.CommandContext(ctx, "go", append(args, path)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("go tool pprof %s: %w: %s", path, err, out)
		}
		fmt.Fprintf(b.out, "\n%s (go tool pprof %s):\n%s", path, strings.Join(append(args[2:], path), " "), out)
	}
	if len(r.problems) > 0 {
		return fmt.Errorf("exactly-once charging violated: %s", strings.Join(r.problems, "; "))
	}
	return nil
}
