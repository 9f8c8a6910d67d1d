package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// machine describes where the numbers were taken.
type machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	LoadAvg  string `json:"load_average_at_start"` // what else was running
	Consumer string `json:"consumer"`              // `billing-consumer version` of the binary under test
	Baseline string `json:"baseline,omitempty"`    // and of the -baseline binary
	Postgres string `json:"postgres"`
	Fsync    string `json:"fsync"`
	Kafka    string `json:"kafka"`
}

// describe collects the machine, the binaries' versions and the versions
// and durability of the services.
func describe(ctx context.Context, pool *pgxpool.Pool, o options) (machine, error) {
	m := machine{CPUs: runtime.NumCPU(), Kafka: "unknown"}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	for _, v := range []struct {
		bin string
		dst *string
	}{{o.bin, &m.Consumer}, {o.baseline, &m.Baseline}} {
		if v.bin == "" {
			continue
		}
		out, err := exec.CommandContext(ctx, v.bin, "version").Output()
		if err != nil {
			return m, fmt.Errorf("%s version: %w (run make build)", v.bin, err)
		}
		*v.dst = strings.TrimSpace(string(out))
	}
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('fsync')").Scan(&m.Postgres, &m.Fsync); err != nil {
		return m, fmt.Errorf("postgres settings: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "scripts/kafka.sh", "version").Output(); err == nil {
		m.Kafka = "Apache Kafka " + strings.TrimSpace(string(out))
	}
	return m, nil
}

// procField returns the value of the first "key: value" line of a /proc
// file, or "".
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// peakRSS returns VmHWM, the peak resident set size of process pid, in
// bytes; read it before the process ends.
func peakRSS(pid int) (int64, error) {
	v := procField(fmt.Sprintf("/proc/%d/status", pid), "VmHWM")
	kb, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("VmHWM of pid %d: %q", pid, v)
	}
	return kb << 10, nil
}

// postmasterPID is the pid of the Postgres server: the parent of the
// backend serving this connection. Its CPU and its children's is
// Postgres's CPU (pgCPU).
func postmasterPID(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, fmt.Errorf("pg_backend_pid: %w", err)
	}
	ppid, _, ok := procCPU(backend)
	if !ok {
		return 0, fmt.Errorf("postgres backend %d is not a process of this machine: its CPU cannot be measured", backend)
	}
	return ppid, nil
}

// pgCPU returns the CPU seconds used so far by the postmaster and its
// living children (the backends, the WAL writer, the checkpointer, ...).
// A backend that exits takes its CPU with it; the consumers' pools keep
// theirs for the whole run.
func pgCPU(postmaster int) float64 {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var total float64
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		if ppid, secs, ok := procCPU(pid); ok && (pid == postmaster || ppid == postmaster) {
			total += secs
		}
	}
	return total
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat: 100
// on every Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the parent pid and the user+system CPU seconds of pid.
func procCPU(pid int) (int, float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	end := strings.LastIndexByte(string(b), ')') // the command name may hold spaces
	if end < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[end+1:])) // state, ppid, ..., utime (f[11]), stime (f[12])
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return ppid, (ut + st) / clockTicks, true
}
