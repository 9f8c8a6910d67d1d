package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
)

// consumerProc is a running `billing-consumer run` and its HTTP address.
type consumerProc struct {
	*harness.Process
	httpAddr string
}

// startConsumer runs bin with exactly env (plus PATH and a free
// BILLING_HTTP_ADDR), its output appended to log.
func startConsumer(bin string, env []string, log io.Writer) (*consumerProc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := harness.Start(bin, []string{"run"}, append([]string{"BILLING_HTTP_ADDR=" + addr}, env...), log)
	if err != nil {
		return nil, err
	}
	return &consumerProc{Process: p, httpAddr: addr}, nil
}

// exited returns a non-nil error once the process has ended.
func (p *consumerProc) exited() error {
	if exited, err := p.Exited(); exited {
		return fmt.Errorf("billing-consumer exited early: %v", err)
	}
	return nil
}

// waitReady polls /readyz until the consumer is ready, the process exits,
// or ctx ends.
func (p *consumerProc) waitReady(ctx context.Context) error {
	if err := p.WaitReady(ctx, p.httpAddr); err != nil {
		return fmt.Errorf("billing-consumer %w", err)
	}
	return nil
}

// peakRSS returns VmHWM, the peak resident set size of process pid, in
// bytes.
func peakRSS(pid int) (int64, error) {
	v := procField(fmt.Sprintf("/proc/%d/status", pid), "VmHWM")
	kb, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("VmHWM of pid %d: %q", pid, v)
	}
	return kb << 10, nil
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat; it
// is 100 on every Linux architecture Go supports.
const clockTicks = 100

// cpuSnapshot is the CPU time used so far, in seconds, by the processes
// of interest and by the whole machine.
type cpuSnapshot struct {
	at                                 time.Time
	consumer, harness, postgres, kafka float64
	machineBusy, machineTotal          float64 // all CPUs, from /proc/stat
}

// services are the pids of the Kafka broker and the Postgres postmaster
// under test, found by their listening ports (other brokers and clusters
// on the machine do not count as theirs); 0 when not found.
type services struct{ kafka, postgres int }

// takeCPU reads the CPU time of the consumer (pid), of this process (the
// harness and the simulator), of the Postgres postmaster and its children
// (the backends) and of the Kafka broker.
func takeCPU(consumerPID int, svc services) cpuSnapshot {
	s := cpuSnapshot{at: time.Now()}
	self := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		ppid, secs, ok := procCPU(pid)
		if !ok {
			continue
		}
		switch {
		case pid == consumerPID:
			s.consumer += secs
		case pid == self:
			s.harness += secs
		case svc.postgres != 0 && (pid == svc.postgres || ppid == svc.postgres):
			s.postgres += secs
		case pid == svc.kafka:
			s.kafka += secs
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		for i := 1; i < len(f) && i <= 8; i++ {
			v, _ := strconv.ParseFloat(f[i], 64)
			s.machineTotal += v / clockTicks
			if i != 4 && i != 5 { // idle, iowait
				s.machineBusy += v / clockTicks
			}
		}
	}
	return s
}

// listenerPID returns the pid of the process listening on TCP port, or 0.
func listenerPID(port int) int {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); err == nil && int(p) == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && inodes[target] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

// procCPU returns the parent pid and the user+system CPU seconds of pid.
func procCPU(pid int) (int, float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
	if open < 0 || end < open {
		return 0, 0, false
	}
	f := strings.Fields(string(b[end+1:])) // state is f[0], ppid f[1]; utime, stime are fields 14, 15
	if len(f) < 13 {
		return 0, 0, false
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	ppid, _ := strconv.Atoi(f[1])
	return ppid, (ut + st) / clockTicks, true
}

// cpuUse is the CPU used between two snapshots, in cores (CPU seconds per
// second of wall time).
type cpuUse struct {
	Consumer, Harness, Postgres, Kafka, Other, Idle float64
}

// bench is the CPU of the processes of the bench: the consumer, Postgres,
// Kafka, and the harness with the simulator (not Other).
func (c cpuUse) bench() float64 { return c.Consumer + c.Postgres + c.Kafka + c.Harness }

// saturated reports whether less than a quarter of a core per CPU was
// idle: whatever the run measured was bounded by CPU.
func (c cpuUse) saturated(cpus int) bool { return c.Idle < 0.25*float64(cpus) }

// since returns the CPU used from a to b. Other is the rest of the busy
// time: other processes of the machine, and postgres backends that ended
// between the snapshots.
func since(a, b cpuSnapshot) cpuUse {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return cpuUse{}
	}
	u := cpuUse{
		Consumer: (b.consumer - a.consumer) / wall,
		Harness:  (b.harness - a.harness) / wall,
		Postgres: max(0, b.postgres-a.postgres) / wall,
		Kafka:    (b.kafka - a.kafka) / wall,
	}
	busy := (b.machineBusy - a.machineBusy) / wall
	u.Idle = (b.machineTotal-a.machineTotal)/wall - busy
	u.Other = max(0, busy-u.Consumer-u.Harness-u.Postgres-u.Kafka)
	return u
}
