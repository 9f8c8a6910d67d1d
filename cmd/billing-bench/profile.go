package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// profiler takes the profiles of -profile (make profile) from the
// consumer's BILLING_PPROF_ADDR listener: a CPU profile from its
// first finished event on, the steady state of the drain, and at the end
// its allocation profile (every allocation since it started). A nil
// *profiler does nothing.
type profiler struct {
	dir     string     // where cpu.pprof and allocs.pprof go
	seconds int        // length of the CPU profile
	addr    string     // the consumer's BILLING_PPROF_ADDR
	began   time.Time  // when the CPU profile was asked for; zero before
	done    chan error // the CPU profile's outcome
	out     io.Writer  // the terminal
}

// start asks, the first time only, for a CPU profile in the background.
func (p *profiler) start(ctx context.Context) {
	if p == nil || !p.began.IsZero() {
		return
	}
	p.began, p.done = time.Now(), make(chan error, 1)
	go func() { p.done <- p.save(ctx, fmt.Sprintf("profile?seconds=%d", p.seconds), "cpu.pprof") }()
}

// finish waits for the CPU profile, then saves the allocation profile. A
// drain that ended before the CPU profile did is reported: the profile
// then holds idle time.
func (p *profiler) finish(ctx context.Context) error {
	if p == nil || p.done == nil {
		return nil
	}
	if left := time.Until(p.began.Add(time.Duration(p.seconds) * time.Second)); left > 0 {
		fmt.Fprintf(p.out, "\nnote: the backlog was drained %.1f s before the CPU profile ended: raise -profile-backlog\n", left.Seconds())
	}
	if err := <-p.done; err != nil {
		return err
	}
	return p.save(ctx, "allocs", "allocs.pprof")
}

// save fetches /debug/pprof/<path> of the consumer into file in p.dir.
func (p *profiler) save(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/debug/pprof/"+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("pprof %s: %w", path, err)
	}
	defer resp.Body.Close()
	f, err := os.Create(filepath.Join(p.dir, file))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("pprof %s: %s", path, resp.Status)
	}
	if err == nil {
		_, err = io.Copy(f, resp.Body)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// runProfile drains one backlog of -profile-backlog records from
// -profile-partitions partitions under the profiler, exactly-once checked
// as every drain; -profile-large makes it one of the sweep's large-batch
// drains.
func (b *bench) runProfile(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	prof := &profiler{dir: b.o.profileDir, seconds: b.o.profileSeconds, addr: ln.Addr().String(), out: b.out}
	ln.Close()
	if err := os.MkdirAll(prof.dir, 0o755); err != nil {
		return err
	}
	s := b.defaultDrain(b.under)
	s.backlog, s.partitions, s.prof, s.env = b.o.profileBacklog, b.o.profilePartitions, prof, []string{"BILLING_PPROF_ADDR=" + prof.addr}
	if b.o.profileLarge {
		s.produce, s.batching, s.env = produceLarge, batchings[1].name, append(s.env, "GOMEMLIMIT="+podGoMemLimit)
	}
	d, err := b.drain(ctx, s)
	if err != nil {
		return err
	}
	if len(d.Problems) > 0 {
		return fmt.Errorf("exactly-once charging violated: %s", strings.Join(d.Problems, "; "))
	}
	return nil
}
